#!/usr/bin/env bash
# Set up .venv, then lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check src tests benchmarks $(test -d experiments && echo experiments)
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
