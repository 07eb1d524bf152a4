"""Start-up of the command line: wall time of `marconi --help`, `marconi simulate --help`
and `import marconi`, each in a fresh process (median of `--repeats`), with every extra
installed, and the heavy packages each one loaded (none is the target).

    .venv/bin/python benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "dask", "distributed", "matplotlib")
CASES = {
    "import marconi": "import marconi",
    "marconi --help": "from marconi.cli import main\ntry:\n    main(['--help'])\n"
                      "except SystemExit:\n    pass",
    "marconi simulate --help": "from marconi.cli import main\ntry:\n"
                               "    main(['simulate', '--help'])\nexcept SystemExit:\n    pass",
}
REPORT = ("\nimport sys\nprint('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & "
          + repr(set(HEAVY)) + "))")


def once(code: str) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code + REPORT],
                         capture_output=True, text=True, check=True).stdout
    seconds = time.perf_counter() - start
    heavy = next(line for line in out.splitlines() if line.startswith("HEAVY"))
    return seconds, ast.literal_eval(heavy.removeprefix("HEAVY "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} cores, Python {sys.version.split()[0]}, median of "
          f"{args.repeats} fresh processes")
    print(f"{'command':28} {'seconds':>8}  heavy modules loaded")
    for name, code in CASES.items():
        runs = [once(code) for _ in range(args.repeats)]
        heavy = sorted({m for _, loaded in runs for m in loaded})
        print(f"{name:28} {statistics.median(s for s, _ in runs):8.3f}  "
              f"{', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
