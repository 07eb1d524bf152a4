"""The same systems and traces under both replay protocols: serving (the default: as a
server runs the trace) and sequential (the paper's: each request committed before the next
is looked up). docs/architecture.md, "Replay protocols".

    .venv/bin/python experiments/bench_replays.py [--quick] [--plot out/replays.png]
        [--workers 2]

Prints, per trace and capacity, FLOPs saved (%) by each system under each protocol, the
serving replay's queueing (requests that waited, the most running at once), and each
policy's margin over sglang+ under both; then one line per trace: how often each policy
led sglang+ under each protocol. The agent trajectories and Mooncake come from the shared
data folder and are skipped without it. `--quick`: ShareGPT at two capacities only.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import available, grid_parser, trace

from marconi.core.spec import PAPER_7B
from marconi.sim.result import SimConfig
from marconi.sim.run import run

SYSTEMS = ("sglang+", "vllm-2026", "marconi", "marconi+")
# (trace name of common.trace, capacities): from the contended to the roomy
GRID = (("sharegpt", ("1GB", "2GB", "4GB", "8GB")),
        ("swe-agent", ("10GB", "20GB", "40GB", "80GB")),
        ("mooncake[0:2000]", ("20GB", "40GB", "80GB")))
QUICK = (("sharegpt", ("2GB", "4GB")),)


def one(job: tuple[str, str, str, str]) -> dict[str, Any]:
    name, capacity, system, replay = job
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       replay=replay)
    s = run(trace(name), config, warn=False).summary()
    out = {"trace": name, "capacity": capacity, "system": system, "replay": replay,
           "saved": 100 * s.flops_saved_rate, "alpha": s.alpha}
    if s.served is not None:
        out |= {"waited": s.served.waited, "running": s.served.max_running}
    return out



def main() -> None:
    args = grid_parser(__doc__).parse_args()
    grid = available(QUICK if args.quick else GRID)
    jobs = [(n, c, s, r) for n, caps in grid for c in caps for s in SYSTEMS
            for r in ("serving", "sequential")]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = {(r["trace"], r["capacity"], r["system"], r["replay"]): r
                for r in pool.map(one, jobs)}
    print(f"FLOPs saved %, serving / sequential (paper-7b); margin over sglang+ in points; "
          f"{len(jobs)} runs")
    for name, capacities in grid:
        print(f"\n{name}")
        print(f"  {'capacity':>8}  " + "  ".join(f"{s:>17}" for s in SYSTEMS)
              + "  waited/running (sglang+, served)")
        for c in capacities:
            cells = [f"{rows[name, c, s, 'serving']['saved']:7.2f} / "
                     f"{rows[name, c, s, 'sequential']['saved']:6.2f}" for s in SYSTEMS]
            lru = rows[name, c, "sglang+", "serving"]
            print(f"  {c:>8}  " + "  ".join(f"{x:>17}" for x in cells)
                  + f"  {lru['waited']}/{lru['running']}")
        for s in SYSTEMS[1:]:
            margins = {r: [rows[name, c, s, r]["saved"] - rows[name, c, "sglang+", r]["saved"]
                           for c in capacities] for r in ("serving", "sequential")}
            print(f"  {s} - sglang+: serving " + ", ".join(f"{m:+.2f}" for m in
                                                          margins["serving"])
                  + "; sequential " + ", ".join(f"{m:+.2f}" for m in margins["sequential"]))
    if args.plot:
        draw(grid, rows, Path(args.plot))


def draw(grid: list[tuple[str, tuple[str, ...]]], rows: dict[Any, dict[str, Any]],
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(grid), figsize=(5 * len(grid), 3.6), squeeze=False)
    for ax, (name, capacities) in zip(axes[0], grid, strict=True):
        for k, s in enumerate(SYSTEMS):
            for replay, style in (("serving", "-"), ("sequential", ":")):
                ax.plot(capacities, [rows[name, c, s, replay]["saved"] for c in capacities],
                        style, marker="o", color=f"C{k}",
                        label=f"{s} ({replay})" if name == grid[0][0] else None)
        ax.set_title(name)
        ax.set_xlabel("capacity")
        ax.set_ylabel("FLOPs saved %")
    fig.legend(loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
