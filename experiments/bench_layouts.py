"""How the ranking of systems changes under engines' memory layouts, at equal memory.

    .venv/bin/python experiments/bench_layouts.py [--systems a,b] [--traces sharegpt,swe]

Every system replays each trace under each layout at the same memory (docs/embedding.md):
- `bytes`: the paper's single byte budget (KV per token, states at their size);
- `sglang`: SGLang's layout: KV per token beside a state pool of 0.9 / 1.9 of the memory;
- `vllm`: vLLM's layout for hybrid models: KV in blocks of `vllm_block_tokens(spec)`
  tokens (80 for paper-7b), one budget;
- `own`: each peer in its own engine's layout, every other system in the byte budget.
Model paper-7b, no bounds. Prints the token hit rate, the rank (1: best) and the share
of commits refused (too big beside what is pinned) of each system per layout, and the
FLOPs saved in its own layout.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from common import TRAJS

from marconi.core.layout import Layout
from marconi.core.spec import PAPER_7B, ModelSpec
from marconi.core.units import parse_size
from marconi.peers.mamba_align import vllm_layout
from marconi.peers.mamba_radix import sglang_layout
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.workload import Trace, TraceOptions, load_trace

SYSTEMS = "vllm+,sglang+,marconi,marconi+,sglang-2026,vllm-2026"
TRACES = {"sharegpt": ("sharegpt", TraceOptions(min_turns=10), ("2GB", "5GB")),
          "swe": (str(TRAJS), TraceOptions(sessions=None), ("20GB", "40GB"))}
OWN: dict[str, Callable[[ModelSpec, int], Layout]] = {
    "sglang-2026": sglang_layout, "sglang-2026-extra": sglang_layout, "vllm-2026": vllm_layout}


def layouts(system: str, capacity: int) -> dict[str, Layout]:
    """The layouts a system runs under at `capacity` bytes."""
    own = OWN.get(system)
    return {"bytes": Layout(), "sglang": sglang_layout(PAPER_7B, capacity),
            "vllm": vllm_layout(PAPER_7B, capacity),
            "own": own(PAPER_7B, capacity) if own else Layout()}


def replay(trace: Trace, system: str, capacity: int, layout: Layout) -> dict:
    config = SimConfig(replay="sequential", retune=False,
                       spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       page_size=layout.page_size, state_slots=layout.state_slots)
    return run(trace, config).summary().to_json()


def ranks(scores: dict[str, float]) -> dict[str, int]:
    order = sorted(scores, key=lambda s: -scores[s])
    return {s: order.index(s) + 1 for s in scores}


def table(trace: Trace, capacity: str, systems: list[str]) -> None:
    size = parse_size(capacity)
    runs = {s: {name: replay(trace, s, size, layout)
                for name, layout in layouts(s, size).items()} for s in systems}
    names = list(layouts(systems[0], size))
    hit = {n: {s: runs[s][n]["token_hit_rate"] for s in systems} for n in names}
    rank = {n: ranks(hit[n]) for n in names}
    refused = {n: {s: runs[s][n]["refused_commits"] / max(1, runs[s][n]["commits"])
                   for s in systems} for n in names}
    print(f"\n{trace.name}, {capacity} ({layouts('sglang-2026', size)['own'].describe()} "
          f"for sglang; {layouts('vllm-2026', size)['own'].describe()} for vllm)")
    print(f"{'system':16}" + "".join(f"{n + ' hit% (rank) refused':>27}" for n in names)
          + f"{'own PFLOPs saved':>18}")
    for s in systems:
        cells = "".join(f"{100 * hit[n][s]:14.1f} ({rank[n][s]}) {100 * refused[n][s]:7.1f}%"
                        for n in names)
        print(f"{s:16}{cells}{runs[s]['own']['flops_saved'] / 1e15:18.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=SYSTEMS)
    parser.add_argument("--traces", default="sharegpt,swe")
    args = parser.parse_args()
    systems = args.systems.split(",")
    for key in args.traces.split(","):
        source, options, capacities = TRACES[key]
        if key == "swe" and not TRAJS.is_dir():
            print(f"\n{key}: skipped, {TRAJS} not found")
            continue
        trace, t0 = load_trace(source, options=options), time.perf_counter()
        for capacity in capacities:
            table(trace, capacity, systems)
        print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
