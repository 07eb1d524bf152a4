"""Instructions one replay executes, at this tree and at a baseline revision: a speed
comparison this machine's drift cannot blur (wall times of the same replay move by 20-30%
from one hour to the next here; instruction counts by under 1%).

    .venv/bin/python benchmarks/bench_instructions.py --baseline REV [--systems vllm+]
        [--requests 600] [--capacity 20GB] [--bounds]

Each count is valgrind's (cachegrind, no cache simulation) for one process that loads the
mini-swe-agent trajectories (from the trace cache) and replays their first `--requests`
requests, minus the same process replaying none (imports and loading), so what is left
is the replay. `src` of this tree or of REV (a temporary git worktree) is first on
PYTHONPATH; PYTHONHASHSEED is fixed. Needs valgrind and the shared data folder; says so
and stops without them. Under valgrind a replay runs some 50 times slower: 600 requests
of vLLM+ take about 45 s each.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common import REPO, TRAJS, worktree

CHILD = """
import sys
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig
from marconi.sim.metrics import rate
from marconi.sim.replay import simulate
from marconi.workload import TraceOptions, load_trace
from marconi.workload.types import Trace
system, n, capacity, bounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
trace = load_trace(sys.argv[5], options=TraceOptions(sessions=None))
trace = Trace(trace.name, trace.requests[:n], trace.meta)
if n:
    # every revision's sequential replay (those before the serving replay know no other)
    how = {"replay": "sequential"} if "replay" in SimConfig.__dataclass_fields__ else {}
    r = simulate(trace, SimConfig(spec=PAPER_7B, capacity=capacity, system=system,
                                  bounds=bounds, **how)).records  # read alike by every revision
    print("token_hit_rate", rate(r.hit.sum(), r.n_input.sum()))
"""


def count(src: Path, system: str, n: int, capacity: str, bounds: bool) -> tuple[int, str]:
    """Instructions of one child process (and what it printed)."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, "-c", CHILD, system, str(n), capacity, "1" if bounds else "0",
           str(TRAJS)]
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed (PYTHONPATH={src}):\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", "")), out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--systems", default="vllm+")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--capacity", default="20GB")
    parser.add_argument("--bounds", action="store_true", help="replay with bounds too")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind not found: nothing measured")
        return
    if not TRAJS.is_dir():
        print(f"{TRAJS} not present: nothing measured")
        return
    print(f"# first {args.requests} requests of {TRAJS}, {args.capacity}, bounds "
          f"{'on' if args.bounds else 'off'}; baseline {args.baseline}; instructions of the "
          "replay (a process replaying none subtracted)")
    print(f"{'system':10} {'baseline':>15} {'now':>15} {'now / baseline':>15}  figures")
    with worktree(args.baseline) as base:
        assert base is not None
        for system in args.systems.split(","):
            counts, printed = [], []
            for src in (base, REPO / "src"):
                floor, _ = count(src, system, 0, args.capacity, args.bounds)
                total, said = count(src, system, args.requests, args.capacity, args.bounds)
                counts.append(total - floor)
                printed.append(said)
            verdict = "identical" if printed[0] == printed[1] else f"DIFFER: {printed}"
            print(f"{system:10} {counts[0]:15,} {counts[1]:15,} {counts[1] / counts[0]:15.3f}"
                  f"  {verdict}", flush=True)


if __name__ == "__main__":
    main()
