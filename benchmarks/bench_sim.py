"""Replay speed of every system on ShareGPT and the SWE-agent trajectories, with trace loading
timed separately and the process's peak memory.

    .venv/bin/python benchmarks/bench_sim.py [--no-bounds] [--systems a,b] [--swe-capacity 20GB]
        [--cores python,compiled] [--replay sequential|serving] [--concurrent] [--command]

ShareGPT: first 100 sessions with >= 10 rounds at 5 GB. SWE-agent: the mini-swe-agent
trajectories in ../shared/data at 40 GB, or `--swe-capacity` (skipped when absent). Model paper-7b.
`--cores` replays each system on each core in turn (`MARCONI_CORE`; docs/architecture.md,
"The compiled core"). `--replay`: the protocol timed (docs/architecture.md, "Replay
protocols"); sequential by default, the one every figure recorded before the serving replay
was measured under. `--concurrent`: the sequential replay's overlap (`SimConfig.concurrent`,
each request pinning what it resumes from while it runs). `--command` times the whole command
instead, start-up included:
`marconi simulate sharegpt --sessions all --min-turns 1 --system S --capacity 5GB --json
--quiet` (every conversation of the file, the trace cache warm) on each core, beside a plain
JSON parse of the packaged ShareGPT file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

from common import TRAJS

from marconi.core.compiled import CORES, chosen
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.systems import SYSTEMS
from marconi.workload import TraceOptions, load_trace


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(name: str, source: str, options: TraceOptions, capacity: str, systems: list[str],
          bounds: bool, cores: list[str | None], concurrent: bool = False,
          replay: str = "sequential") -> None:
    t0 = time.perf_counter()
    trace = load_trace(source, options=options)
    load = time.perf_counter() - t0
    print(f"\n{name}: {len(trace)} requests, {trace.input_tokens / 1e6:.1f}M input tokens, "
          f"capacity {capacity}, replay {replay}{', concurrent' if concurrent else ''}; "
          f"trace loading {load:.2f} s")
    print(f"{'system':20} {'core':>8} {'replay s':>9} {'CPU s':>7} {'token hit':>10} "
          f"{'alpha':>7} {'peak RSS MB':>12}")
    for system in systems:
        for core in cores:
            if core is not None:
                os.environ["MARCONI_CORE"] = core
            config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=bounds,
                               concurrent=concurrent, replay=replay)
            t0, cpu = time.perf_counter(), time.process_time()
            s = run(trace, config).summary()
            print(f"{system:20} {chosen():>8} {time.perf_counter() - t0:9.2f} "
                  f"{time.process_time() - cpu:7.2f} {100 * s.token_hit_rate:9.1f}% "
                  f"{'untuned' if s.alpha is None else format(s.alpha, '.1f'):>7} "
                  f"{peak_rss_mb():12.0f}", flush=True)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds of one command, and its stdout."""
    t0, cpu = time.perf_counter(), children_cpu()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, children_cpu() - cpu, out.stdout


# The packaged file is cut inside its last conversation: the plain parse reads every
# whole object of its array with `json`'s own decoder, as a reader that tolerates a cut must.
PARSE = """import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
decode, pos, n = json.JSONDecoder().raw_decode, text.index("[") + 1, 0
while True:
    while text[pos:pos + 1] in (" ", ",", "\\n", "\\r", "\\t"):
        pos += 1
    try:
        _, pos = decode(text, pos)
    except ValueError:
        break
    n += 1
print(n)
"""


def command(systems: list[str], cores: list[str | None], replay: str) -> None:
    """The whole `marconi simulate` command on ShareGPT, against a JSON parse of it."""
    from marconi.workload.readers.sharegpt import default_path

    path = default_path()
    print(f"\nthe whole command on ShareGPT ({path.stat().st_size / 1e6:.0f} MB of JSON), "
          "start-up included, trace cache warm:")
    wall, cpu, out = timed([sys.executable, "-c", PARSE, str(path)])
    print(f"{'a JSON parse of the file':34} {wall:8.2f} s wall {cpu:8.2f} s CPU  "
          f"({out.strip()} conversations)")
    base = [sys.executable, "-m", "marconi", "simulate", "sharegpt", "--sessions", "all",
            "--min-turns", "1", "--capacity", "5GB", "--json", "--quiet", "--replay", replay]
    timed([*base, "--system", "vanilla"])  # warms the trace cache
    for system in systems:
        for core in cores:
            env = {**os.environ, "MARCONI_CORE": core} if core else None
            wall, cpu, out = timed([*base, "--system", system], env)
            hit = json.loads(out)["token_hit_rate"]
            print(f"{'simulate --system ' + system:24} {core or 'default':>9} {wall:8.2f} s wall "
                  f"{cpu:8.2f} s CPU  token hit {100 * hit:.2f}%", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--no-bounds", action="store_true", help="skip bounds (replay only)")
    parser.add_argument("--swe-capacity", default="40GB",
                        help="capacity of the SWE-agent replays (20GB: the vLLM+ speed target)")
    parser.add_argument("--cores", default=None, metavar="python,compiled",
                        help="replay each system on each of these cores in turn")
    parser.add_argument("--replay", choices=("sequential", "serving"), default="sequential",
                        help="the replay protocol timed (default: sequential)")
    parser.add_argument("--concurrent", action="store_true",
                        help="requests overlap as they arrive (each pins what it resumes from)")
    parser.add_argument("--command", action="store_true",
                        help="time the whole simulate command on ShareGPT instead")
    args = parser.parse_args()
    systems = args.systems.split(",")
    cores: list[str | None] = list(args.cores.split(",")) if args.cores else [None]
    for core in cores:
        if core not in (None, *CORES):
            parser.error(f"--cores: {core!r} is not a core ({', '.join(CORES)})")
    print(f"machine: {platform.machine()}, {platform.python_version()}, "
          f"bounds {'off' if args.no_bounds else 'on'}")
    if args.command:
        command(systems, cores, args.replay)
        return
    if args.concurrent and args.replay == "serving":
        parser.error("--concurrent is the sequential replay's overlap: not with --replay serving")
    bench("ShareGPT", "sharegpt", TraceOptions(min_turns=10), "5GB", systems,
          not args.no_bounds, cores, args.concurrent, args.replay)
    if TRAJS.is_dir():
        bench("SWE-agent", str(TRAJS), TraceOptions(sessions=None), args.swe_capacity, systems,
              not args.no_bounds, cores, args.concurrent, args.replay)
    else:
        print(f"\nSWE-agent: skipped, {TRAJS} not present")


if __name__ == "__main__":
    main()
