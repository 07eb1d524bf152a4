"""marconi+ against its peers in expectation: every agent configuration, many arrival seeds.

    .venv/bin/python experiments/bench_plus_seeds.py [--seeds 10] [--workers 2] [--csv FILE]
    .venv/bin/python experiments/bench_plus_seeds.py --from-csv FILE

The reproduction sweep runs each configuration once, at arrival seed 0. On the agent trace
a configuration's result moves with the seed (the calls of a trajectory arrive after
exponential gaps), and the best of four peers moves with it: a single seed can hand one
peer its luckiest draw. This benchmark reruns sglang+, sglang-2026, vllm-2026, marconi
and marconi+ on every agent configuration of `experiments/plus_vs_peers.toml` (read from
`experiments/results/sweep.csv`, `common.configurations`) at seeds 0..K-1 and
prints, per configuration:

- each system's mean FLOPs saved over the seeds;
- the peer with the best mean, and marconi+'s paired margin over it: mean and 95%
  confidence interval (Student t over the per-seed differences, K - 1 degrees of freedom);
- on how many seeds marconi+ saves at least as much as that seed's best peer (the
  sweep's own test, run K times).

A seed moves the agents' calls, not which sessions are replayed. ShareGPT and Mooncake
have no seed to vary: a chat's turns arrive by the typing model (response time + the next
message's typing time; `marconi compare sharegpt --seeds 2` finds every seed equal), and
a Mooncake window replays the trace's own timestamps.
Needs `../shared/data` (skips with a message when absent).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import DATA, PEERS, cell, configurations
from tqdm import tqdm

from marconi.core.spec import resolve_model
from marconi.sim.metrics import PairedMargin, paired_margin
from marconi.sim.sweep import run_cell

SYSTEMS = (*PEERS, "marconi+")


@dataclass(frozen=True, slots=True)
class Margin:
    peer: str  # the peer with the best mean
    paired: PairedMargin  # marconi+ - that peer, points, over the seeds
    seeds_ok: int  # seeds where marconi+ >= that seed's best peer (- 0.01 point)


def margin(saved: dict[str, np.ndarray]) -> Margin:
    """marconi+ against the best-on-average peer; `saved` maps system -> % per seed."""
    peer = max(PEERS, key=lambda p: float(saved[p].mean()))
    best = np.max([saved[p] for p in PEERS], axis=0)
    return Margin(peer, paired_margin(saved["marconi+"], saved[peer]),
                  int(np.sum(saved["marconi+"] >= best - 0.01)))


def label(p: dict[str, str]) -> str:
    model = p["model"].replace("paper-7b", "").lstrip(",") or "default"
    return f"{p['capacity']}, {model}, {p['sps']} sps"


def unique(configs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The configurations, each setting once (`paper-7b,N=128` is `paper-7b`)."""
    out: dict[tuple[object, ...], dict[str, str]] = {}
    for p in configs:
        spec = dataclasses.replace(resolve_model(p["model"]), name="")
        key = (spec, *(v for k, v in p.items() if k != "model"))
        out.setdefault(key, p)
    return list(out.values())


def _run(job: tuple[dict[str, str], str, int]) -> float:
    params, system, seed = job
    row = run_cell(cell({**params, "seed": str(seed)}, system))
    if row["status"] != "ok":
        raise RuntimeError(f"{system} on {label(params)}, seed {seed}: {row['error']}")
    return 100 * float(row["flops_saved_rate"])


def run(seeds: int, workers: int, out: Path | None) -> None:
    configs = unique([p for p, _ in configurations() if p["dataset"] == "swe-agent"])
    jobs = [(p, s, k) for p in configs for k in range(seeds) for s in SYSTEMS]
    print(f"{len(configs)} agent configurations x {seeds} seeds x {len(SYSTEMS)} systems "
          f"= {len(jobs)} runs", file=sys.stderr)
    with ProcessPoolExecutor(workers) as pool:
        values = list(tqdm(pool.map(_run, jobs), total=len(jobs), file=sys.stderr,
                           desc="runs", mininterval=10))
    results = dict(zip(((label(p), s, k) for p, s, k in jobs), values, strict=True))
    if out is not None:
        with out.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["configuration", "system", "seed", "flops_saved_pct"])
            writer.writerows([*key, f"{v:.4f}"] for key, v in results.items())
    table([label(p) for p in configs], seeds, results)


def table(labels: Sequence[str], seeds: int,
          results: dict[tuple[str, str, int], float]) -> None:
    print(f"swe-agent: FLOPs saved %, mean over arrival seeds 0-{seeds - 1}; margin = "
          "marconi+ - the best peer on average, points, with its 95% CI")
    print("| configuration | " + " | ".join(SYSTEMS) + " | best peer | margin | 95% CI | "
          "seeds marconi+ >= best peer |")
    print("|---" * (len(SYSTEMS) + 5) + "|")
    margins = []
    for name in dict.fromkeys(labels):
        saved = {s: np.array([results[(name, s, k)] for k in range(seeds)]) for s in SYSTEMS}
        m = margin(saved)
        margins.append(m)
        cells = " | ".join(f"{saved[s].mean():.2f}" for s in SYSTEMS)
        p = m.paired
        print(f"| {name} | {cells} | {m.peer} | {p.mean:+.2f} | "
              f"[{p.low:+.2f}, {p.high:+.2f}] | {m.seeds_ok} / {seeds} |")
    above = sum(m.paired.low > 0 for m in margins)
    below = sum(m.paired.high < 0 for m in margins)
    print(f"\n{len(margins)} configurations: marconi+ above the best peer on average "
          f"(CI above 0) in {above}, below it (CI below 0) in {below}, within noise in "
          f"{len(margins) - above - below}; worst mean margin "
          f"{min(m.paired.mean for m in margins):+.2f}; per seed, marconi+ >= the best peer in "
          f"{sum(m.seeds_ok for m in margins)} of {seeds * len(margins)} runs")


def table_from(path: Path) -> None:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        results = {(r["configuration"], r["system"], int(r["seed"])): float(r["flops_saved_pct"])
                   for r in rows}
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"--from-csv {path}: not a file --csv wrote ({err})") from None
    seeds = 1 + max((k for _, _, k in results), default=-1)
    labels = list(dict.fromkeys(r["configuration"] for r in rows))
    missing = [key for key in ((n, s, k) for n in labels for s in SYSTEMS for k in range(seeds))
               if key not in results]
    if missing or seeds < 2:
        raise SystemExit(f"--from-csv {path}: incomplete ({len(missing)} runs missing, "
                         f"{seeds} seeds; first missing: {missing[:1]})")
    table(labels, seeds, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="arrival seeds 0..K-1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--csv", type=Path, help="also write every run's result here")
    parser.add_argument("--from-csv", type=Path, metavar="FILE",
                        help="print the table from a file --csv wrote, without running")
    args = parser.parse_args()
    if args.from_csv:
        table_from(args.from_csv)
        return
    if args.seeds < 2:
        parser.error(f"--seeds must be >= 2 for a confidence interval, got {args.seeds}")
    if not DATA.exists():
        print(f"skipped: the agent trajectories are not at {DATA}", file=sys.stderr)
        return
    run(args.seeds, args.workers, args.csv)


if __name__ == "__main__":
    main()
