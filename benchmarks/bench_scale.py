"""Replay of a synthetic agent trace of a million requests: seconds and peak RSS per system.

    .venv/bin/python benchmarks/bench_scale.py [--requests 1000000] [--systems sglang+,marconi+]
        [--shadow-sample-after N|none] [--cores python,compiled] [--walk]
        [--replay sequential|serving]

The trace is too big to hold (a million agent calls hold some 2 G distinct tokens), so it
is a stream: `synthetic:agent` traces of `--chunk` sessions each (seed = chunk index),
one after another (a chunk's arrivals start where the previous chunk's end), cut at
`--requests`; the simulator reads it request by request (`marconi.sim.simulate` takes any
iterable of requests) and keeps per-request records in numpy columns. The
infinite-cache bounds are off: they hold every distinct prefix of the trace, so their
memory is the trace's own size (docs/architecture.md, "Metrics"). Each system runs in a
process of its own, so that its peak RSS is its own; a line every `--every` seconds
shows progress. `CPU s` is the process's CPU time: on a shared machine wall time also
counts the other work; `gen CPU s` is the part of it spent generating the stream, so that
`replay CPU s`, the rest, is the simulator's own. `--cores` runs each system on each core
in turn (`MARCONI_CORE`, docs/architecture.md, "The compiled core"), alternated, and
prints the ratios; `--walk` adds the floor: the same stream, each request's tokens made
bytes and compared with its session's previous request (one memcmp), nothing cached.
`--replay serving` serves the requests as a server does (docs/architecture.md, "Replay
protocols"; the default flags: 256 running, 8K-token steps, running requests holding
memory): a serving replay needs the whole trace, so the stream is read into memory first
(its generation and that read are `gen CPU s`; a million requests hold some 8 GB of
tokens); `--replay sequential` (the default here) streams it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

from marconi.core.compiled import CORES, chosen
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig, simulate
from marconi.sim.result import SHADOW_SAMPLE_AFTER
from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.types import Request


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


GENERATING = [0.0]  # CPU seconds the stream spent generating requests


def stream(requests: int, chunk: int, every: float) -> Iterator[Request]:
    """`requests` agent calls, generated `chunk` sessions at a time (each chunk's
    requests made whole, then handed out: the clock is read per chunk, not per request)."""
    served, offset, start, last = 0, 0.0, time.perf_counter(), time.perf_counter()
    for k in range(sys.maxsize):
        cpu = time.process_time()
        trace = load_trace("synthetic:agent", options=TraceOptions(
            sessions=chunk, seed=k, use_cache=False))
        made = [dataclasses.replace(request, session_id=f"{k}/{request.session_id}",
                                    arrival=offset + request.arrival)
                for request in trace.requests[:requests - served]]
        GENERATING[0] += time.process_time() - cpu
        for out in made:
            yield out
            served += 1
            if time.perf_counter() - last >= every:
                last = time.perf_counter()
                print(f"  {served:,} requests, {last - start:.0f} s, "
                      f"peak RSS {peak_rss_mb():.0f} MB", flush=True)
        if served == requests:
            return
        offset += trace[-1].arrival


def one(system: str, requests: int, chunk: int, capacity: str, every: float,
        sample_after: int | None, replay: str) -> None:
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       shadow_sample_after=sample_after, replay=replay, retune=False)
    start, cpu = time.perf_counter(), time.process_time()
    if replay == "serving":  # the whole trace first: its read counts as generation
        trace = Trace("stream", tuple(stream(requests, chunk, every)))
        GENERATING[0] = time.process_time() - cpu
        print(f"  held {requests:,} requests, peak RSS {peak_rss_mb():.0f} MB; serving",
              flush=True)
        s = simulate(trace, config).summary()
    else:
        s = simulate(stream(requests, chunk, every), config).summary()
    total = time.process_time() - cpu
    print(f"{system:10} {chosen():>8} {s.requests:>10,} {s.input_tokens / 1e9:6.2f}G "
          f"{time.perf_counter() - start:9.1f} {total:9.1f} {GENERATING[0]:9.1f} "
          f"{total - GENERATING[0]:9.1f} {peak_rss_mb():8.0f} {100 * s.token_hit_rate:9.2f}% "
          f"{100 * s.flops_saved_rate:11.2f}%", flush=True)


def walk(requests: int, chunk: int, every: float) -> None:
    """The floor: each request's tokens as bytes, compared with its session's previous
    request (the memcmp a cache's walk does at least), nothing kept beyond that."""
    start, cpu = time.perf_counter(), time.process_time()
    previous: dict[str, bytes] = {}
    n = tokens = shared = 0
    chunk_of = ""
    for request in stream(requests, chunk, every):
        key = request.tokens().tobytes()
        k = request.session_id.partition("/")[0]
        if k != chunk_of:  # a chunk's sessions end with it: hold one chunk's at a time
            previous, chunk_of = {}, k
        last = previous.get(request.session_id, b"")
        m = min(len(last), len(key))
        shared += key[:m] == last[:m]
        previous[request.session_id] = key
        n += 1
        tokens += request.n_input
    total = time.process_time() - cpu
    print(f"{'walk':10} {'-':>8} {n:>10,} {tokens / 1e9:6.2f}G "
          f"{time.perf_counter() - start:9.1f} {total:9.1f} {GENERATING[0]:9.1f} "
          f"{total - GENERATING[0]:9.1f} {peak_rss_mb():8.0f} {'':>10} {'':>12} "
          f"({shared:,} requests extend their session's previous one)", flush=True)


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
    parser.add_argument("--cores", default=None, metavar="python,compiled",
                        help="run each system on each of these cores in turn (default: the "
                        "core MARCONI_CORE chooses)")
    parser.add_argument("--walk", action="store_true", help="add the memcmp walk's floor")
    parser.add_argument("--replay", choices=("sequential", "serving"), default="sequential",
                        help="the replay protocol (serving holds the whole trace in memory)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process runs one system
    args = parser.parse_args()
    if args.one == "walk":
        walk(args.requests, args.chunk, args.every)
        return
    if args.one:
        sample = args.shadow_sample_after
        one(args.one, args.requests, args.chunk, args.capacity, args.every,
            None if sample == "none" else int(sample), args.replay)
        return
    cores = args.cores.split(",") if args.cores else [None]
    for core in cores:
        if core not in (None, *CORES):
            parser.error(f"--cores: {core!r} is not a core ({', '.join(CORES)})")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"synthetic:agent stream of {args.requests:,} requests in chunks of {args.chunk} "
          f"sessions, paper-7b, {args.capacity}, bounds off, replay {args.replay}, "
          f"marconi+'s shadows sampled after {args.shadow_sample_after} requests")
    print(f"{'system':10} {'core':>8} {'requests':>10} {'input':>7} {'seconds':>9} "
          f"{'CPU s':>9} {'gen CPU s':>9} {'replay s':>9} {'RSS MB':>8} {'token hit':>10} "
          f"{'FLOPs saved':>12}", flush=True)
    for system in (["walk"] if args.walk else []) + args.systems.split(","):
        for core in cores if system != "walk" else [None]:
            env = {**os.environ, "MARCONI_CORE": core} if core else None
            subprocess.run([sys.executable, __file__, "--one", system, "--requests",
                            str(args.requests), "--chunk", str(args.chunk), "--capacity",
                            args.capacity, "--every", str(args.every),
                            "--shadow-sample-after", args.shadow_sample_after,
                            "--replay", args.replay], check=True,
                           env=env)


if __name__ == "__main__":
    main()
