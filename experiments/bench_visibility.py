"""What marconi's engine would cache if it showed a running request's prefix before its
finish: the serving replay with each visibility rule (`--visibility`, docs/architecture.md,
"Replay protocols") for the systems that run on marconi's engine, beside the emulations of
SGLang and vLLM on their own engines' rules.

    .venv/bin/python experiments/bench_visibility.py [--quick] [--workers 2]
        [--plot experiments/results/visibility.png]

marconi's engine commits a request whole at its finish (`finish`): a request queued behind
a running one that computes the same long prompt cannot reuse any of it, whatever the
policy. `chunk` shows the input so far after each prefill chunk but the last, with a state
at the chunk's end (SGLang's rule); `block` after every prefill step (vLLM's). Prints FLOPs
saved (%) per trace, capacity, system and rule, each rule's margin over sglang+ on the same
rule, and marconi+'s margin over the best emulation. The agent trajectories and Mooncake
come from the shared data folder and are skipped without it. `--quick`: one Mooncake
window and ShareGPT at 2 GB.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import available, grid_parser, save_figure, trace

from marconi.core.spec import PAPER_7B
from marconi.sim.result import VISIBILITIES, SimConfig
from marconi.sim.run import run

OURS = ("sglang+", "marconi", "marconi+")  # the systems of marconi's engine (rule: finish)
ENGINES = ("sglang-2026", "vllm-2026")  # the emulations, each on its own engine's rule
GRID = (("sharegpt", ("2GB", "4GB")),
        ("swe-agent", ("10GB", "20GB", "40GB")),
        ("mooncake[0:2000]", ("20GB", "40GB", "80GB")),
        ("mooncake[1000:3000]", ("120GB",)),
        ("mooncake[4000:6000]", ("100GB",)),
        ("mooncake[9000:11000]", ("80GB",)),
        ("mooncake[10000:12000]", ("50GB",)))
QUICK = (("sharegpt", ("2GB",)), ("mooncake[0:2000]", ("80GB",)))


def one(job: tuple[str, str, str, str | None]) -> dict[str, Any]:
    name, capacity, system, rule = job
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       visibility=rule)
    s = run(trace(name), config, warn=False).summary()
    return {"trace": name, "capacity": capacity, "system": system, "rule": rule,
            "saved": 100 * s.flops_saved_rate}


def jobs_of(grid: list[tuple[str, tuple[str, ...]]]) -> list[tuple[str, str, str, str | None]]:
    out: list[tuple[str, str, str, str | None]] = []
    for name, capacities in grid:
        for c in capacities:
            out += [(name, c, s, rule) for s in OURS for rule in VISIBILITIES]
            out += [(name, c, s, None) for s in ENGINES]
    return out


def main() -> None:
    args = grid_parser(__doc__).parse_args()
    grid = available(QUICK if args.quick else GRID)
    jobs = jobs_of(grid)
    rows: dict[tuple[str, str, str, str | None], float] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for k, r in enumerate(pool.map(one, jobs), 1):
            rows[r["trace"], r["capacity"], r["system"], r["rule"]] = r["saved"]
            print(f"\r{k}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"FLOPs saved %, serving replay (paper-7b), {len(jobs)} runs; marconi's engine's "
          f"systems under each rule ({', '.join(VISIBILITIES)}), the emulations under their "
          "own")
    head = [f"{s} {rule}" for s in OURS for rule in VISIBILITIES] + list(ENGINES)
    print("| trace | capacity | " + " | ".join(head) + " | marconi+ - best emulation, "
          + " / ".join(VISIBILITIES) + " | marconi+ - sglang+, " + " / ".join(VISIBILITIES)
          + " |")
    print("|---" * (len(head) + 4) + "|")
    for name, capacities in grid:
        for c in capacities:
            ours = [rows[name, c, s, rule] for s in OURS for rule in VISIBILITIES]
            engines = [rows[name, c, s, None] for s in ENGINES]
            best = max(engines)
            lead = [rows[name, c, "marconi+", rule] - best for rule in VISIBILITIES]
            over = [rows[name, c, "marconi+", rule] - rows[name, c, "sglang+", rule]
                    for rule in VISIBILITIES]
            print(f"| {name} | {c} | " + " | ".join(f"{x:.2f}" for x in ours + engines)
                  + " | " + " / ".join(f"{x:+.2f}" for x in lead) + " | "
                  + " / ".join(f"{x:+.2f}" for x in over) + " |")
    if args.plot:
        draw(grid, rows, Path(args.plot))


def draw(grid: list[tuple[str, tuple[str, ...]]],
         rows: dict[tuple[str, str, str, str | None], float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [(n, c) for n, caps in grid for c in caps]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(configs)), 4.2))
    width = 0.8 / (len(VISIBILITIES) + len(ENGINES))
    xs = range(len(configs))
    for k, rule in enumerate(VISIBILITIES):
        ax.bar([x + k * width for x in xs], [rows[n, c, "marconi+", rule] for n, c in configs],
               width, label=f"marconi+, {rule}", color=f"C{k}")
    for j, s in enumerate(ENGINES, len(VISIBILITIES)):
        ax.bar([x + j * width for x in xs], [rows[n, c, s, None] for n, c in configs],
               width, label=f"{s} (its own rule)", color=f"C{j}", hatch="//")
    ax.set_xticks([x + 0.4 - width / 2 for x in xs])
    ax.set_xticklabels([f"{n}\n{c}" for n, c in configs], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("FLOPs saved %")
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
