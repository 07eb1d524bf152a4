"""Overhead of marconi+'s online tuning, per request, on 2 cores.

    .venv/bin/python benchmarks/bench_shadows.py [--system marconi+-overlap | marconi+-no-overlap]

Seconds spent feeding the shadow caches (and, for `marconi+-overlap`, teaching its overlap
planner), per request and in total, beside the live cache's own replay time (the driver
calls the tuner after each commit, never inside a lookup). Traces: ShareGPT at 2 GB, the
mini-swe-agent trajectories at 20 GB and the first 2,000 requests of Mooncake's
conversation trace at 40 GB (these two skipped when ../shared/data is absent).
"""

from __future__ import annotations

import argparse
import os

from common import TRAJS, load

from marconi.core.spec import PAPER_7B
from marconi.plus.shadows import ShadowReport
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace


def shadows(system: str, name: str, capacity: str, trace: Trace) -> None:
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       replay="sequential", retune=False)  # its shadows replay in turn
    result = simulate(trace, config)
    tuning = result.tuning
    assert isinstance(tuning, ShadowReport)
    spent, experts = tuning.seconds, len(tuning.totals)
    print(f"{system} {name} {capacity}: {len(trace)} requests, {experts} shadow experts: "
          f"{1e3 * spent / len(trace):.2f} ms per request in shadows, {spent:.1f} s of "
          f"{result.seconds:.1f} s in all; final expert {tuning.expert}, "
          f"{len(tuning.switches)} switches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="marconi+",
                        choices=("marconi+", "marconi+-overlap", "marconi+-no-overlap"))
    args = parser.parse_args()
    cases = [("sharegpt", "2GB", load_trace("sharegpt", options=TraceOptions(min_turns=10)))]
    if TRAJS.exists():
        cases.append(("swe-agent", "20GB", load_trace(TRAJS)))
    mooncake = load("mooncake[0:2000]")
    if mooncake is not None:
        cases.append(("mooncake[0:2000]", "40GB", mooncake))
    print(f"cores: {os.cpu_count()}")
    for case in cases:
        shadows(args.system, *case)


if __name__ == "__main__":
    main()
