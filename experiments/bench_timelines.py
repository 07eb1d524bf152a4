"""Why marconi+ trails sglang+ on some agent traces under the serving replay: each policy
runs on its own timeline, and marconi+ can measure its experts only on its own.

    .venv/bin/python experiments/bench_timelines.py [--quick] [--workers 2]
        [--plot experiments/results/timelines.png]

The serving replay issues an agent's next call when its previous call finishes (a closed
loop, docs/architecture.md "Replay protocols"), so what a policy hits moves every later
arrival, the queue and what is visible when. marconi+ runs one of its experts and keeps
the others as shadows served on its own timeline; one of them, `none/lru`, is sglang+'s
configuration (judicious admission, LRU over leaves). For every agent configuration of
bench_plus.py (design and fresh) and bench_plus_unseen.py (design and held-out), served,
this prints FLOPs saved (%) by sglang+ on its own timeline, by marconi+, by sglang+'s
configuration on marconi+'s timeline (marconi+'s `none/lru` shadow), marconi+'s best
shadow, marconi-oracle (Marconi at the best alpha in hindsight, each alpha on its own
timeline) and the mean TTFT of sglang+ and marconi+. Where marconi+ trails sglang+ but
not sglang+'s own configuration on marconi+'s timeline, the difference is the timeline's,
which no shadow on marconi+'s timeline can measure. Needs the agent trajectories in the
shared data folder (skipped without them). `--quick`: the three design configurations.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import PLUS_DESIGN, PLUS_FRESH, TRAJS, grid_parser, save_figure, trace, unseen_trace

from marconi.core.spec import resolve_model
from marconi.sim.result import SimConfig
from marconi.sim.run import run
from marconi.workload.types import Trace

SYSTEMS = ("sglang+", "marconi+", "marconi-oracle")
SGLANG_EXPERT = "none/lru"  # sglang+'s configuration among marconi+'s experts
# the agent configurations of bench_plus_unseen.py's design and held-out sets (less its
# `swe()` at 20 and 40 GB on paper-7b: bench_plus.py's design rows, the same runs)
UNSEEN = ("swe(half=even)|20GB", "swe(half=even)|40GB",
          "swe()|40GB|paper-7b,ssm=24,attn=12,mlp=36", "swe(half=odd,seed=21)|20GB",
          "swe(half=odd,seed=22)|40GB", "swe(seed=23,gap=2.5)|30GB")


def configurations(quick: bool) -> list[tuple[str, str, str]]:
    """(trace name, capacity, model) of every agent configuration."""
    design = [(n, c, "paper-7b") for n, c in PLUS_DESIGN if n == "swe-agent"]
    if quick:
        return design
    fresh = [(n, c, m) for _, n, c, m in PLUS_FRESH if n.startswith("swe-agent")]
    unseen = []
    for config in UNSEEN:
        key, capacity, *model = config.split("|")
        unseen.append((key, capacity, model[0] if model else "paper-7b"))
    return design + fresh + unseen


def trace_of(name: str) -> Trace:
    return unseen_trace(name) if name.startswith("swe(") else trace(name)


def one(job: tuple[str, str, str, str]) -> dict[str, Any]:
    name, capacity, model, system = job
    config = SimConfig(spec=resolve_model(model), capacity=capacity, system=system,
                       bounds=False)
    s = run(trace_of(name), config, warn=False).summary()
    out: dict[str, Any] = {"job": job[:3], "system": system,
                           "saved": 100 * s.flops_saved_rate, "ttft": s.ttft_mean}
    if s.experts is not None:
        out["lru"] = 100 * s.experts.saved[SGLANG_EXPERT]
        out["best"] = (s.experts.best, 100 * s.experts.saved[s.experts.best])
    return out


def main() -> None:
    args = grid_parser(__doc__).parse_args()
    if not TRAJS.is_dir():
        print(f"skipped: no agent trajectories at {TRAJS}", file=sys.stderr)
        return
    configs = configurations(args.quick)
    jobs = [(n, c, m, s) for n, c, m in configs for s in SYSTEMS]
    got: dict[tuple[tuple[str, str, str], str], dict[str, Any]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for k, r in enumerate(pool.map(one, jobs), 1):
            got[r["job"], r["system"]] = r
            print(f"\r{k}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"FLOPs saved %, serving replay, {len(configs)} agent configurations; `sglang+'s "
          f"config on marconi+'s timeline`: marconi+'s {SGLANG_EXPERT} shadow")
    print("| trace | capacity | model | sglang+ | marconi+ | vs sglang+ | sglang+'s config on "
          "marconi+'s timeline | marconi+ vs it | best shadow | marconi-oracle | "
          "marconi+ / oracle | mean TTFT sglang+ / marconi+ (s) |")
    print("|---" * 12 + "|")
    rows = []
    for config in configs:
        lru, plus = got[config, "sglang+"], got[config, "marconi+"]
        oracle = got[config, "marconi-oracle"]["saved"]
        best_name, best = plus["best"]
        rows.append((config, lru["saved"], plus["saved"], plus["lru"]))
        print(f"| {config[0]} | {config[1]} | {config[2]} | {lru['saved']:.2f} | "
              f"{plus['saved']:.2f} | {plus['saved'] - lru['saved']:+.2f} | "
              f"{plus['lru']:.2f} | {plus['saved'] - plus['lru']:+.2f} | "
              f"{best_name} {best:.2f} | {oracle:.2f} | {100 * plus['saved'] / oracle:.1f}% | "
              f"{lru['ttft']:.1f} / {plus['ttft']:.1f} |")
    behind = [r for r in rows if r[2] < r[1]]
    print(f"marconi+ below sglang+ on {len(behind)} of {len(rows)}; of those, below sglang+'s "
          f"configuration on its own timeline on {sum(r[2] < r[3] for r in behind)}")
    if args.plot:
        draw(rows, Path(args.plot))


def draw(rows: list[tuple[tuple[str, str, str], float, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(rows)), 4.0))
    xs = range(len(rows))
    ax.axhline(0, color="black", lw=0.8)
    ax.bar([x - 0.2 for x in xs], [r[2] - r[1] for r in rows], 0.4,
           label="marconi+ - sglang+ (its own timeline)")
    ax.bar([x + 0.2 for x in xs], [r[2] - r[3] for r in rows], 0.4,
           label="marconi+ - sglang+'s configuration on marconi+'s timeline")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{c[0]}\n{c[1]}" for c, *_ in rows], fontsize=6, rotation=35,
                       ha="right")
    ax.set_ylabel("FLOPs saved, points")
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
