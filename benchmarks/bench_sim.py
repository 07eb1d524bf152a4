"""Replay speed of every system on ShareGPT and the SWE-agent trajectories, with trace loading
timed separately and the process's peak memory.

    .venv/bin/python benchmarks/bench_sim.py [--no-bounds] [--systems a,b] [--swe-capacity 20GB]

ShareGPT: first 100 sessions with >= 10 rounds at 5 GB. SWE-agent: the mini-swe-agent
trajectories in ../shared/data at 40 GB, or `--swe-capacity` (skipped when absent). Model paper-7b.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

from common import TRAJS

from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.systems import SYSTEMS
from marconi.workload import TraceOptions, load_trace


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(name: str, source: str, options: TraceOptions, capacity: str, systems: list[str],
          bounds: bool) -> None:
    t0 = time.perf_counter()
    trace = load_trace(source, options=options)
    load = time.perf_counter() - t0
    print(f"\n{name}: {len(trace)} requests, {trace.input_tokens / 1e6:.1f}M input tokens, "
          f"capacity {capacity}; trace loading {load:.2f} s")
    print(f"{'system':20} {'replay s':>9} {'token hit':>10} {'alpha':>7} {'peak RSS MB':>12}")
    for system in systems:
        config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=bounds)
        t0 = time.perf_counter()
        s = run(trace, config).summary()
        print(f"{system:20} {time.perf_counter() - t0:9.2f} {100 * s.token_hit_rate:9.1f}% "
              f"{'untuned' if s.alpha is None else format(s.alpha, '.1f'):>7} "
              f"{peak_rss_mb():12.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--no-bounds", action="store_true", help="skip bounds (replay only)")
    parser.add_argument("--swe-capacity", default="40GB",
                        help="capacity of the SWE-agent replays (20GB: the vLLM+ speed target)")
    args = parser.parse_args()
    systems = args.systems.split(",")
    print(f"machine: {platform.machine()}, {platform.python_version()}, "
          f"bounds {'off' if args.no_bounds else 'on'}")
    bench("ShareGPT", "sharegpt", TraceOptions(min_turns=10), "5GB", systems,
          not args.no_bounds)
    if TRAJS.is_dir():
        bench("SWE-agent", str(TRAJS), TraceOptions(sessions=None), args.swe_capacity, systems,
              not args.no_bounds)
    else:
        print(f"\nSWE-agent: skipped, {TRAJS} not present")


if __name__ == "__main__":
    main()
