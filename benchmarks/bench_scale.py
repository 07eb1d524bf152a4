"""Replay of a synthetic agent trace of a million requests: seconds and peak RSS per system.

    .venv/bin/python benchmarks/bench_scale.py [--requests 1000000] [--systems sglang+,marconi+]
        [--shadow-sample-after N|none]

The trace is too big to hold (a million agent calls hold some 2 G distinct tokens), so it
is a stream: `synthetic:agent` traces of `--chunk` sessions each (seed = chunk index),
one after another (a chunk's arrivals start where the previous chunk's end), cut at
`--requests`; the simulator reads it request by request (`marconi.sim.simulate` takes any
iterable of requests) and keeps per-request records in numpy columns. The
infinite-cache bounds are off: they hold every distinct prefix of the trace, so their
memory is the trace's own size (docs/architecture.md, "Metrics"). Each system runs in a
process of its own, so that its peak RSS is its own; a line every `--every` seconds
shows progress. `CPU s` is the process's CPU time: on a shared machine wall time also
counts the other work.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig, simulate
from marconi.sim.result import SHADOW_SAMPLE_AFTER
from marconi.workload import TraceOptions, load_trace
from marconi.workload.types import Request


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stream(requests: int, chunk: int, every: float) -> Iterator[Request]:
    """`requests` agent calls, generated `chunk` sessions at a time."""
    served, offset, start, last = 0, 0.0, time.perf_counter(), time.perf_counter()
    for k in range(sys.maxsize):
        trace = load_trace("synthetic:agent", options=TraceOptions(
            sessions=chunk, seed=k, use_cache=False))
        for request in trace:
            if served == requests:
                return
            yield dataclasses.replace(request, session_id=f"{k}/{request.session_id}",
                                      arrival=offset + request.arrival)
            served += 1
            if time.perf_counter() - last >= every:
                last = time.perf_counter()
                print(f"  {served:,} requests, {last - start:.0f} s, "
                      f"peak RSS {peak_rss_mb():.0f} MB", flush=True)
        offset += trace[-1].arrival


def one(system: str, requests: int, chunk: int, capacity: str, every: float,
        sample_after: int | None) -> None:
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       shadow_sample_after=sample_after)
    start, cpu = time.perf_counter(), time.process_time()
    s = simulate(stream(requests, chunk, every), config).summary()
    print(f"{system:10} {s.requests:>10,} {s.input_tokens / 1e9:9.2f}G "
          f"{time.perf_counter() - start:10.1f} {time.process_time() - cpu:10.1f} "
          f"{peak_rss_mb():12.0f} {100 * s.token_hit_rate:9.2f}% "
          f"{100 * s.flops_saved_rate:11.2f}%", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--systems", default="sglang+,marconi+")
    parser.add_argument("--capacity", default="20GB")
    parser.add_argument("--chunk", type=int, default=100, help="sessions per generated chunk")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--shadow-sample-after", default=str(SHADOW_SAMPLE_AFTER),
                        metavar="N|none", help="marconi+'s shadows sampled after N requests "
                        "(the default); none: exact shadows")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process runs one system
    args = parser.parse_args()
    if args.one:
        sample = args.shadow_sample_after
        one(args.one, args.requests, args.chunk, args.capacity, args.every,
            None if sample == "none" else int(sample))
        return
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"synthetic:agent stream of {args.requests:,} requests in chunks of {args.chunk} "
          f"sessions, paper-7b, {args.capacity}, bounds off, marconi+'s shadows sampled "
          f"after {args.shadow_sample_after} requests")
    print(f"{'system':10} {'requests':>10} {'input':>10} {'seconds':>10} {'CPU s':>10} "
          f"{'peak RSS MB':>12} {'token hit':>10} {'FLOPs saved':>12}", flush=True)
    for system in args.systems.split(","):
        subprocess.run([sys.executable, __file__, "--one", system, "--requests",
                        str(args.requests), "--chunk", str(args.chunk), "--capacity",
                        args.capacity, "--every", str(args.every),
                        "--shadow-sample-after", args.shadow_sample_after], check=True)


if __name__ == "__main__":
    main()
