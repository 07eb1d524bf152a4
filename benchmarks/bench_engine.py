"""Reference-engine benchmark: TTFT cold vs cached (see `marconi engine-bench --help`).

Usage: python benchmarks/bench_engine.py [engine-bench options]
"""

from __future__ import annotations

import sys

from marconi.commands.engine_bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
