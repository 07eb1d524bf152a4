#!/usr/bin/env bash
# The test suite again at the lowest versions pyproject.toml claims: every direct
# dependency and extra at its floor (uv's lowest-direct resolution), in .venv-floors.
# torch is the CPU build of this machine class (its floor is that build). CI runs this
# after scripts/test.sh; a floor that fails here is a claim to raise in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-floors
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.marconi-floors"
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install -q uv
    wheels=()
    if [ -d /opt/wheels ]; then wheels=(--find-links /opt/wheels); fi
    # torch's floor is the CPU build: exact, so no CUDA build is ever resolved
    VIRTUAL_ENV="$PWD/$venv" "$venv/bin/uv" pip install -q --resolution lowest-direct \
        "${wheels[@]}" -e ".[traces,plot,engine,server,distributed,api]" \
        "torch==2.13.0+cpu" "pytest>=8" "hypothesis>=6.100"
    echo "$want" > "$stamp"
fi
echo "floors: $("$venv/bin/python" -c 'import importlib.metadata as m
print(", ".join(f"{n} {m.version(n)}" for n in ("numpy", "scipy", "msgspec", "pyarrow",
      "pandas", "matplotlib", "dask", "transformers", "fastapi", "uvicorn", "openai",
      "sentencepiece", "mistral-common", "tokenizers", "jinja2")))')"
# the lock's own versions are checked by the main run
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    --deselect tests/test_pins.py::test_installed_versions_are_the_lock "$@"
