"""marconi's bootstrap tuner under the serving replay: how it converges on each family of
traces, and what re-tuning and its guard are worth (docs/architecture.md, "Tuner").

    .venv/bin/python experiments/bench_tuner.py [--workers 2] [--quick]
    .venv/bin/python experiments/bench_tuner.py --windows 1000,500,250 [--set tuner|design|fresh]

Per trace and capacity, FLOPs saved (%) by marconi as shipped (re-tuning on windows of at
most 250 requests, `--retune-window`, guarded by an alpha-0 twin), by the paper's tuner
(`--no-retune`: one window of 5 x n0 requests), by `marconi-oracle` (the best fixed alpha
in hindsight, each alpha served) and by sglang+; then the shipped tuner's first window (`n0`, its
length), the alphas it adopted in order, how often its guard restored alpha 0, and
whether the paper's tuner finished, and the seconds each replay took (the re-tuning
tuner's replays run in the simulator's own processes, as it waits for each). The agent
trajectories and Mooncake come from the shared data folder and are skipped without it.
`--quick`: ShareGPT at two capacities.

`--windows W,...` compares re-tuning windows instead (`--retune-window`): marconi at each
cap beside sglang+, per configuration of a set (`tuner`: the grid above; `design`: the
configurations experiments/bench_plus.py's main table looked at, with the shifting trace
at 19 and 21 GB beside its 20; `fresh`: its fresh sets), then per cap the lowest margin
over sglang+, the configurations more than 0.5 point below it, the sum of the margins, and
where the cap is below the first one given.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from common import PLUS_DESIGN, PLUS_FRESH, available, trace

from marconi.core.spec import PAPER_7B, resolve_model
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



Config = tuple[str, str, str]  # trace, capacity, model


def window_set(name: str) -> list[Config]:
    """The configurations of `--set NAME` whose data is here."""
    if name == "tuner":
        wanted = [(n, c, "paper-7b") for n, cs in GRID for c in cs]
    elif name == "design":
        wanted = [(n, c, "paper-7b") for n, c in PLUS_DESIGN] + [
            ("shift:sharegpt+swe-agent", c, "paper-7b") for c in ("19GB", "21GB")]
    else:
        wanted = [(n, c, m) for _, n, c, m in PLUS_FRESH]
    here = {n for n, _ in available(tuple((n, (c,)) for n, c, _ in wanted))}
    return [c for c in wanted if c[0] in here]


def window_job(job: tuple[str, str, str, str, int | None]) -> float:
    name, capacity, model, system, window = job
    config = SimConfig(spec=resolve_model(model), capacity=capacity, system=system,
                       bounds=False, retune_window=window)
    return 100 * run(_trace(name), config, warn=False).summary().flops_saved_rate


def windows(caps: list[int], configs: list[Config], workers: int) -> None:
    jobs: list[tuple[str, str, str, str, int | None]] = [(*c, "sglang+", None) for c in configs]
    jobs += [(*c, "marconi", w) for w in caps for c in configs]
    print(f"{len(jobs)} runs ...", file=sys.stderr)
    with ProcessPoolExecutor(workers) as pool:
        saved = dict(zip(jobs, pool.map(window_job, jobs), strict=True))
    print("FLOPs saved %, serving replay; marconi re-tuning on windows of at most W requests")
    print("| trace | capacity | model | sglang+ | " + " | ".join(f"marconi W={w}" for w in caps)
          + " | " + " | ".join(f"W={w} - sglang+" for w in caps) + " |")
    print("|---" * (4 + 2 * len(caps)) + "|")
    margins: dict[int, list[float]] = {w: [] for w in caps}
    for c in configs:
        lru = saved[(*c, "sglang+", None)]
        ours = [saved[(*c, "marconi", w)] for w in caps]
        for w, x in zip(caps, ours, strict=True):
            margins[w].append(x - lru)
        print(f"| {' | '.join(c)} | {lru:.2f} | " + " | ".join(f"{x:.2f}" for x in ours)
              + " | " + " | ".join(f"{x - lru:+.2f}" for x in ours) + " |")
    first = caps[0]
    for w in caps:
        m = margins[w]
        below = [(c, x - y) for c, x, y in zip(configs, m, margins[first], strict=True)
                 if x < y - 0.005]
        print(f"W={w}: lowest margin {min(m):+.2f}, {sum(x < -0.5 for x in m)} of {len(m)} "
              f"more than 0.5 below sglang+, sum {sum(m):+.2f}; below W={first} on "
              f"{len(below)}" + "".join(f"; {c[0]} {c[1]} {d:+.2f}" for c, d in below))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="ShareGPT at two capacities")
    parser.add_argument("--windows", default=None, metavar="W,...",
                        help="compare these re-tuning windows (module docstring)")
    parser.add_argument("--set", default="tuner", choices=("tuner", "design", "fresh"),
                        help="with --windows: the configurations")
    args = parser.parse_args()
    if args.windows is not None:
        try:
            caps = [int(w) for w in args.windows.split(",")]
        except ValueError:
            parser.error(f"--windows: whole numbers, comma-separated; got {args.windows!r}")
        if any(w < 1 for w in caps):
            parser.error(f"--windows: each at least 1; got {args.windows!r}")
        windows(caps, window_set(args.set), args.workers)
        return
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
