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
# What runs here: what the floors can change. A floor moves the versions of this venv
# only, so every test of code that runs in it runs here (the core, policies, simulator,
# readers, server, plots, engine, sweeps: numpy, scipy and msgspec reach all of them).
# Left out, each for the reason named:
# - the lock's own versions: checked by the main run;
# - the engines' replays and servers (test_integrations, test_realpeers, test_serve_vllm):
#   their work runs in the engines' environments (.venv-peers), pinned by their own locks.
#   This venv's side of them is the simulator (run here by test_sim and the rest) and, for
#   test_serve_vllm, marconi.engines.real.serve_replay's openai client, the one piece not
#   run at the floors (tests/server drives the openai client at its floor).
# - the engine fuzz (tests/engine/test_fuzz.py, a third of this run's time): 23 cases of
#   30 requests under pressure, each held to torch forwards; the floors leave torch and
#   transformers at the lock's own versions (their floors are those versions), and the
#   rest of tests/engine runs here, the engine's exactness against uncached forwards
#   included.
# Adding a test that needs a floor-sensitive package to one of those modules moves it
# out of this rule: give it its own module instead.
# The property tests and fuzz loops run a quarter of their random cases here
# (MARCONI_TEST_EXAMPLES, tests/helpers.py `examples`): the main run covers them whole.
export MARCONI_TEST_EXAMPLES="${MARCONI_TEST_EXAMPLES:-0.25}"
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    --deselect tests/test_pins.py::test_installed_versions_are_the_lock \
    --ignore tests/test_integrations.py --ignore tests/test_realpeers.py \
    --ignore tests/test_serve_vllm.py --ignore tests/engine/test_fuzz.py "$@"
