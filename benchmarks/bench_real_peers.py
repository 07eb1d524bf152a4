"""Each emulation beside the engine's real cache code: fidelity and replay speed.

    .venv/bin/python benchmarks/bench_real_peers.py [--quick] [--pairs sglang,vllm,vllm-0.34]

Needs the engines' environments (`bash scripts/setup-peers.sh`); a pair whose engine is
missing is skipped with a line saying so. Replays ShareGPT, the agent trajectories and the
Mooncake conversation trace (both from ../shared/data, skipped when absent) at two or
three capacities each, model paper-7b, through every pair of `marconi.sim.fidelity`
(SGLang no_buffer and extra_buffer, vLLM 0.32's align, and vLLM 0.34's against the
emulation at 0.34's default block size) and prints per configuration the two
token hit rates and the share of identical hits, then per pair one line

    fidelity sglang-2026 vs sglang-0.5.23: 6 configs, max hit-rate diff 0.12 pt, ...

and the replay time per request of the real code, the emulation and `marconi` on each
trace. `--quick`: a CI-sized subset (40 ShareGPT sessions at two capacities that evict).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from common import load

from marconi.core.spec import PAPER_7B
from marconi.engine_flags import ENGINES
from marconi.engines.real.envs import available
from marconi.sim import SimConfig
from marconi.sim.fidelity import PAIRS, Agreement, agreement, summary_line
from marconi.sim.run import run
from marconi.systems import get_system
from marconi.workload import Trace

FULL = {"sharegpt": ("2GB", "5GB", "10GB"), "swe-agent": ("20GB", "40GB"),
        "mooncake[0:1000]": ("20GB", "60GB")}
QUICK = {"sharegpt(40)": ("1GB", "2GB")}


def marconi_us(trace: Trace, capacity: str) -> float:
    start = time.perf_counter()
    run(trace, SimConfig(spec=PAPER_7B, capacity=capacity, system="marconi", bounds=False,
                         replay="sequential", retune=False), warn=False)
    return 1e6 * (time.perf_counter() - start) / len(trace)


def line(name: str, capacity: str, a: Agreement) -> str:
    first = "-" if a.first_difference is None else str(a.first_difference)
    return (f"  {name:18} {capacity:>5}  {a.emulation:18} {100 * a.emulated_hit_rate:6.2f}%  "
            f"{a.real:36} {100 * a.real_hit_rate:6.2f}%  identical {100 * a.identical:5.1f}%"
            f"  first diff {first:>5}  {a.emulated_us:7.0f} us  {a.real_us:7.0f} us")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a CI-sized subset")
    parser.add_argument("--pairs", default="sglang,vllm,vllm-0.34",
                        help="engines to compare")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.pairs.split(",") if e.strip()]
    pairs = [(emu, real) for emu, real in PAIRS if get_system(real).engine in engines]
    for engine in engines:
        if not available(engine):
            print(f"skipped {engine}: its environment is missing "
                  f"(bash scripts/setup-peers.sh {engine})")
    pairs = [p for p in pairs if available(str(get_system(p[1]).engine))]
    found: dict[tuple[str, str], list[Agreement]] = {p: [] for p in pairs}
    print("per configuration: emulation hit, real hit, identical hits, first differing "
          "request, time per request (emulation, real cache code)")
    for name, capacities in (QUICK if args.quick else FULL).items():
        trace = load(name)
        if trace is None:
            print(f"  {name}: data absent, skipped")
            continue
        for capacity in capacities:
            for emu, real in pairs:
                a = agreement(trace, PAPER_7B, capacity, emu, real)
                found[(emu, real)].append(a)
                print(line(name, capacity, a), flush=True)
            print(f"  {name:18} {capacity:>5}  marconi {marconi_us(trace, capacity):7.0f} us "
                  f"per request ({len(trace)} requests)", flush=True)
    for agreements in found.values():
        if agreements:
            print(summary_line(agreements))
            verdict = ("within the target" if all(a.agrees for a in agreements) else
                       "within its documented bound (docs/peers.md)"
                       if all(a.within_bound for a in agreements) else "PAST ITS BOUND")
            print(f"  {agreements[0].emulation}: {verdict}")
    print("engines: " + ", ".join(f"{e.name} {e.version}" for e in ENGINES.values()
                                  if e.name in engines))


if __name__ == "__main__":
    main()
