#!/usr/bin/env bash
# Create .venv and install marconi with the extras named in $1 (default: dev).
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv/.marconi-installed-$extras"
# the compiled core (setup.py builds it at install): its sources count too
want=$(cat pyproject.toml setup.py scripts/ci-lock.txt src/marconi/core/_native.pyx \
    src/marconi/core/native/*.hpp | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # the package states ranges; scripts/ci-lock.txt pins what is installed here (torch
    # 2.13.0 exactly: it resolves to the CPU build this machine class ships)
    .venv/bin/python -m pip install -q -e ".[$extras]" -c scripts/ci-lock.txt
    echo "$want" > "$stamp"
fi
