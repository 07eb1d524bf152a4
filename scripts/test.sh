#!/usr/bin/env bash
# Set up .venv, then lint, type-check and run the whole test suite.
set -euo pipefail
case "${1:-}" in
    -h|--help)
        cat <<'USAGE'
usage: bash scripts/test.sh [PYTEST-ARGS...]
Sets up .venv (scripts/setup.sh dev), runs ruff and mypy, then pytest with PYTEST-ARGS.
With no arguments: the whole suite, then the simulator's tests again on the Python core.
Pytest's own help: .venv/bin/python -m pytest --help
USAGE
        exit 0;;
esac
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check src tests benchmarks $(test -d experiments && echo experiments)
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
# the whole suite ran on the compiled core where it runs a system (docs/architecture.md,
# "The compiled core"); the simulator's, tuners' and marconi+'s tests again on the Python
# core, its oracle (tests/test_compiled.py drives both in every run)
if [ $# -eq 0 ]; then
    MARCONI_CORE=python .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_sim.py \
        tests/test_tuner.py tests/test_tuner_background.py tests/test_metrics.py tests/test_api.py \
        tests/test_plus.py tests/test_shadows.py tests/test_overlap.py tests/test_density.py \
        tests/test_serving.py
fi
