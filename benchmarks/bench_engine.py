"""Reference-engine benchmark: TTFT cold vs cached (see `marconi engine-bench --help`).

Usage: python benchmarks/bench_engine.py [engine-bench options]

The agent workload reads the mini-swe-agent trajectories of the shared data folder beside
the repository when it is there and no `--agent-data` is given.
"""

from __future__ import annotations

import sys

from common import DATA

from marconi.commands.engine_bench import main

AGENT_DATA = DATA / "mini-swe-agent"

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--agent-data" not in args and AGENT_DATA.is_dir():
        args += ["--agent-data", str(AGENT_DATA)]
    sys.exit(main(args))
