"""marconi's bootstrap tuner under the serving replay: how it converges on each family of
traces, and what re-tuning and its guard are worth (docs/architecture.md, "Tuner").

    .venv/bin/python experiments/bench_tuner.py [--workers 2] [--quick]

Per trace and capacity, FLOPs saved (%) by marconi as shipped (re-tuning on windows of at
most 1,000 requests, guarded by an alpha-0 twin), by the paper's tuner (`--no-retune`:
one window of 5 x n0 requests), by `marconi-oracle` (the best fixed alpha in hindsight,
each alpha served) and by sglang+; then the shipped tuner's first window (`n0`, its
length), the alphas it adopted in order, how often its guard restored alpha 0, and
whether the paper's tuner finished, and the seconds each replay took (the re-tuning
tuner's replays run in the simulator's own processes, as it waits for each). The agent
trajectories and Mooncake come from the shared data folder and are skipped without it.
`--quick`: ShareGPT at two capacities.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from common import available, trace

from marconi.core.spec import PAPER_7B
from marconi.sim.result import SimConfig
from marconi.sim.run import run

# (trace name of common.trace, capacities): ShareGPT chats, agent trajectories, the two
# one after the other (a shift), Mooncake's production requests, and synthetic shapes
GRID = (("sharegpt", ("1GB", "2GB", "3GB", "4GB", "5GB", "8GB")),
        ("swe-agent", ("10GB", "20GB", "40GB", "80GB")),
        ("shift:sharegpt+swe-agent", ("10GB", "20GB")),
        ("mooncake[0:2000]", ("20GB", "60GB")),
        ("synthetic:rag", ("1GB", "4GB")),
        ("synthetic:agent", ("5GB", "20GB")))
QUICK = (("sharegpt", ("2GB", "3GB")),)
RUNS = ("marconi", "once", "marconi-oracle", "sglang+")


def one(job: tuple[str, str, str]) -> dict[str, Any]:
    name, capacity, run_name = job
    config = SimConfig(spec=PAPER_7B, capacity=capacity, bounds=False,
                       system="marconi" if run_name == "once" else run_name)
    if run_name == "once":
        config = dataclasses.replace(config, retune=False)
    s = run(_trace(name), config, warn=False).summary()
    out: dict[str, Any] = {"saved": 100 * s.flops_saved_rate, "status": s.alpha_status,
                           "seconds": s.seconds}
    report = s.tuning.report if s.tuning is not None else None
    if report is not None and "adopted" in report:
        out |= {"n0": report["n0"], "window": report["window"],
                "adopted": [alpha for _, alpha in report["adopted"]],
                "restored": len(report["restored"])}
    return out


def runs(alphas: list[float]) -> str:
    """The alphas adopted in order, a run of equal ones as `a xN`: `1.7, 0 x9, 1`."""
    out: list[list[Any]] = []
    for a in alphas:
        if out and out[-1][0] == a:
            out[-1][1] += 1
        else:
            out.append([a, 1])
    return ", ".join(f"{a:g}" + (f" x{n}" if n > 1 else "") for a, n in out) or "-"


def _trace(name: str) -> Any:
    if name.startswith("synthetic:"):
        from marconi.workload import load_trace

        return load_trace(name)
    return trace(name)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="ShareGPT at two capacities")
    args = parser.parse_args()
    grid = available(QUICK if args.quick else GRID)
    jobs = [(n, c, r) for n, cs in grid for c in cs for r in RUNS]
    print(f"{len(jobs)} runs (marconi-oracle: 21 replays each) ...", file=sys.stderr)
    with ProcessPoolExecutor(args.workers) as pool:
        rows = dict(zip(jobs, pool.map(one, jobs), strict=True))
    print("FLOPs saved %, serving replay (paper-7b)")
    print("| trace | capacity | marconi | paper's tuner | marconi-oracle | sglang+ "
          "| marconi - sglang+ | n0 / window | alphas adopted | guard restored 0 "
          "| paper's tuner | seconds: marconi / paper's tuner / sglang+ |")
    print("|---" * 12 + "|")
    for name, capacities in grid:
        for c in capacities:
            m, once, oracle, lru = (rows[name, c, r] for r in RUNS)
            adopted = runs(m.get("adopted", []))
            window = f"{m['n0']} / {m['window']}" if "n0" in m else "-"
            print(f"| {name} | {c} | {m['saved']:.2f} | {once['saved']:.2f} | "
                  f"{oracle['saved']:.2f} | {lru['saved']:.2f} | "
                  f"{m['saved'] - lru['saved']:+.2f} | {window} | {adopted} | "
                  f"{m.get('restored', 0)} | {once['status']} | {m['seconds']:.1f} / "
                  f"{once['seconds']:.1f} / {lru['seconds']:.1f} |")


if __name__ == "__main__":
    main()
