"""marconi+ against its own LRU configuration (`sglang+`) and the best online system, on
every trace we have, at three capacities each (`--plus`: one of marconi+'s variants in
its column instead; `--peers`: fewer systems to compare with).

    .venv/bin/python experiments/bench_plus_lru.py [--traces T ...] [--out F.jsonl] [--plot F.png]
        [--replay serving|sequential] [--workers N]
    .venv/bin/python experiments/bench_plus_lru.py --report F.jsonl [--plot F.png]
    .venv/bin/python experiments/bench_plus_lru.py --compare BASE.jsonl F.jsonl [G.jsonl ...]
    .venv/bin/python experiments/bench_plus_lru.py --plus marconi+-no-overlap --peers sglang+
    .venv/bin/python experiments/bench_plus_lru.py --cores [--traces T ...]

Traces: the 99 mini-swe-agent trajectories, the Mooncake conversation trace (its first
3,000 requests) and synthetic trace, ShareGPT (100 sessions of >= 10 rounds), and each
synthetic family at its defaults (100 sessions). Data that is absent is skipped with a
line saying so.

Capacities are fractions of the trace's footprint, the peak bytes `sglang+` holds when
nothing is evicted: contended (3%), moderate (10%) and roomy (30%). So every trace is
contended at its first capacity, whatever its size, and no capacity was tuned to a trace.

`--compare` reads runs back (each made with its own `--plus`, the same replay) and prints
each run's system minus the first run's, per configuration, and per family of traces
(the trajectories, Mooncake, ShareGPT, the synthetic shapes): how a variant of marconi+
would move it everywhere.

`--cores` replays marconi+ alone on the Python core and on the compiled core, one after
the other, at every trace and capacity: every figure of its summary (but the seconds) and
every request's hit compared, and the CPU seconds of each (docs/architecture.md, "The
compiled core").

`--replay serving` (the default) replays as a server runs the trace, with the shipped
settings (marconi re-tuning, guarded; marconi+'s shadows served); `--replay sequential`
commits each request before the next arrives, marconi tuning once (the paper's protocol).
The capacities are the same under both: the footprint is measured sequentially. Each row
records its replay. `--workers N` runs N configurations at once.

Systems: every registered system that runs in process without knowing the future
(marconi+'s ablations aside). Columns: FLOPs saved % of marconi+, sglang+ and the best
other online system, marconi+'s margins to each (points), and its regret against the
best of its own experts (points; `Summary.experts`). Targets
(docs/peers.md, "marconi+"): margin to sglang+ >= -0.2 point, to the best online system
>= -0.5 point, everywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import DATA, MOONCAKE, MOONCAKE_SYNTHETIC, TRAJS, load_variants

from marconi.core.spec import PAPER_7B
from marconi.sim.result import SimConfig
from marconi.sim.run import run
from marconi.systems import SYSTEMS
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace

PLUS = "marconi+"
LRU = "sglang+"
FRACTIONS = {"contended": 0.03, "moderate": 0.1, "roomy": 0.3}
SYNTHETIC = ("system-prompt", "multi-turn", "agent", "rag", "twice", "branching")
TRACES = ("swe-agent", "mooncake", "mooncake-synthetic", "sharegpt",
          *(f"synthetic:{name}" for name in SYNTHETIC))
# online systems: no future knowledge, in process; marconi+'s ablations are not peers
ONLINE = tuple(name for name, s in SYSTEMS.items()
               if s.engine is None and not name.startswith(PLUS) and name != "vanilla")


def load(name: str) -> Trace | None:
    """The named trace, or None (with a line saying so) when its data is absent."""
    if name == "swe-agent":
        return load_trace(TRAJS) if TRAJS.is_dir() else _absent(name, TRAJS)
    if name == "mooncake":
        if not MOONCAKE.is_file():
            return _absent(name, MOONCAKE)
        full = load_trace(MOONCAKE)
        return Trace(name, full.requests[:3000], full.meta)
    if name == "mooncake-synthetic":
        return load_trace(MOONCAKE_SYNTHETIC) if MOONCAKE_SYNTHETIC.is_file() \
            else _absent(name, MOONCAKE_SYNTHETIC)
    if name == "sharegpt":
        return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=100))
    return load_trace(name, options=TraceOptions(sessions=100))


def _absent(name: str, path: Path) -> Trace | None:
    """None, saying on stderr which data is absent."""
    print(f"skipped {name}: {path} is absent (the data folder is {DATA})", file=sys.stderr)
    return None


def footprint(trace: Trace) -> int:
    """The peak bytes `sglang+` holds on `trace` when nothing is evicted."""
    config = SimConfig(replay="sequential", retune=False,
                       spec=PAPER_7B, capacity=1 << 50, system=LRU, bounds=False)
    return int(run(trace, config).summary().peak_bytes)


def one(trace: Trace, capacity: int, system: str, replay: str = "serving") -> dict[str, Any]:
    pinned: dict[str, Any] = {"retune": False} if replay == "sequential" else {}
    config = SimConfig(replay=replay, spec=PAPER_7B, capacity=capacity, system=system,
                       bounds=False, **pinned)
    start = time.process_time()
    summary = run(trace, config).summary()
    out: dict[str, Any] = {"saved": float(summary.flops_saved_rate),
                           "cpu_s": time.process_time() - start}
    experts = summary.experts
    if experts is not None:
        out |= {"regret": experts.regret, "bound": experts.bound, "best_expert": experts.best,
                "ran_most": experts.ran_most}
    return out


def configurations(names: tuple[str, ...]) -> Iterator[tuple[str, Trace, str, int]]:
    """(trace name, trace, capacity label, bytes) for every trace found and capacity."""
    for name in names:
        trace = load(name)
        if trace is None:
            continue
        total = footprint(trace)
        for label, fraction in FRACTIONS.items():
            yield name, trace, label, int(total * fraction)


def _row(job: tuple[str, str, int, str, tuple[str, ...], str]) -> dict[str, Any]:
    """One configuration's row: `plus` and `peers` on trace `name` at `capacity` bytes."""
    name, label, capacity, plus, peers, replay = job
    load_variants()  # in a worker process too: the variants run by name
    trace = load(name)
    assert trace is not None  # `configurations` found it
    row: dict[str, Any] = {"trace": name, "capacity": label, "bytes": capacity,
                           "replay": replay, "plus": plus}
    for system in (plus, *peers):
        got = one(trace, capacity, system, replay)
        row[PLUS if system == plus else system] = got["saved"]
        if system == plus:
            row.update({k: v for k, v in got.items() if k != "saved"})
        print(f"[{time.strftime('%H:%M:%S')}] {name} {label} ({capacity / 1e9:.2f} GB) "
              f"{system}: {100 * float(got['saved']):.2f}% in {got['cpu_s']:.1f} s",
              file=sys.stderr, flush=True)
    return row


def measure(names: tuple[str, ...], out: Path | None, plus: str = PLUS,
            peers: tuple[str, ...] = ONLINE, replay: str = "serving",
            workers: int = 1) -> list[dict[str, Any]]:
    jobs = [(name, label, capacity, plus, peers, replay)
            for name, _, label, capacity in configurations(names)]
    rows = []
    with ProcessPoolExecutor(workers) as pool:
        for row in pool.map(_row, jobs):  # in order, each row written as it comes
            rows.append(row)
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


def cores(names: tuple[str, ...], plus: str) -> int:
    """`plus` on each core in turn, every trace and capacity: a table of its FLOPs saved,
    each core's CPU seconds and whether every figure and hit is the same; the number of
    configurations that differ."""
    import os

    from marconi.core import compiled
    from marconi.sim import simulate

    print("| trace | capacity | FLOPs saved % | Python core CPU s | compiled CPU s | x | "
          "figures and hits |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    differ, spent = 0, {core: 0.0 for core in compiled.CORES}
    for name, trace, label, capacity in configurations(names):
        config = SimConfig(replay="sequential", retune=False,
                           spec=PAPER_7B, capacity=capacity, system=plus, bounds=False)
        got = {}
        for core in compiled.CORES:
            os.environ[compiled.CORE_ENV] = core
            start = time.process_time()
            result = simulate(trace, config)
            cpu = time.process_time() - start
            summary = result.summary().to_json()
            summary.pop("seconds")
            if isinstance(summary.get("tuning"), dict):
                summary["tuning"].pop("seconds", None)
            got[core] = (summary, result.records.hit.tolist(), cpu)
            spent[core] += cpu
        same = got["python"][:2] == got["compiled"][:2]
        differ += not same
        slow, fast = got["python"][2], got["compiled"][2]
        print(f"| {name} | {label} ({capacity / 1e9:.2f} GB) "
              f"| {100 * float(got['python'][0]['flops_saved_rate']):.2f} | {slow:.1f} "
              f"| {fast:.1f} | {slow / max(fast, 1e-9):.1f} "
              f"| {'identical' if same else 'DIFFER'} |", flush=True)
    print(f"\n{differ} configurations differ; CPU {spent['python']:.1f} s on the Python core, "
          f"{spent['compiled']:.1f} s compiled "
          f"({spent['python'] / max(spent['compiled'], 1e-9):.1f}x)")
    return differ


def print_table(rows: list[dict[str, Any]]) -> None:
    replays = sorted({str(row.get("replay", "sequential")) for row in rows})
    print(f"replay: {', '.join(replays)}")
    print("| trace | capacity | marconi+ | sglang+ | vs sglang+ | best online | vs best "
          "| regret |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    worst_lru = worst_best = 0.0
    for row in rows:
        plus, lru = 100 * float(row[PLUS]), 100 * float(row[LRU])
        best = max((s for s in ONLINE if s in row), key=lambda s: float(row[s]))
        top = 100 * float(row[best])
        regret = row.get("regret")
        worst_lru, worst_best = min(worst_lru, plus - lru), min(worst_best, plus - top)
        print(f"| {row['trace']} | {row['capacity']} ({float(row['bytes']) / 1e9:.2f} GB) "
              f"| {plus:.2f} | {lru:.2f} | {plus - lru:+.2f} | {best} {top:.2f} "
              f"| {plus - top:+.2f} | {'-' if regret is None else f'{100 * float(regret):.2f}'} |")
    print(f"\nworst margin to sglang+ {worst_lru:+.2f} pt (target >= -0.2), to the best online "
          f"system {worst_best:+.2f} pt (target >= -0.5)")


FAMILIES = {"swe-agent": "agents", "mooncake": "Mooncake", "mooncake-synthetic": "Mooncake",
            "sharegpt": "ShareGPT"}  # the rest: the synthetic shapes


def compare(paths: list[Path]) -> None:
    """Each run's `--plus` system minus the first run's, per configuration and family."""
    runs = [{(r["trace"], r["capacity"]): r
             for r in (json.loads(line) for line in p.read_text().splitlines() if line)}
            for p in paths]
    names = [str(next(iter(r.values())).get("plus", PLUS)) for r in runs]
    replays = {str(r.get("replay", "sequential")) for one_run in runs for r in one_run.values()}
    if len(replays) != 1:
        raise SystemExit(f"--compare: the runs mix replays ({sorted(replays)})")
    base = runs[0]
    print(f"replay: {replays.pop()}; each column: the run's system minus {names[0]} "
          f"({paths[0].name}), FLOPs saved points")
    print("| trace | capacity | " + names[0] + " | " + " | ".join(names[1:]) + " |")
    print("|---" * (len(names) + 2) + "|")
    for key, row in base.items():
        cells = " | ".join(f"{100 * (other[key][PLUS] - row[PLUS]):+.2f}" if key in other else "-"
                           for other in runs[1:])
        print(f"| {key[0]} | {key[1]} | {100 * row[PLUS]:.2f} | {cells} |")
    print("\n| family | " + " | ".join(f"{n}: higher / lower / sum / worst" for n in names[1:])
          + " |")
    print("|---" * len(names) + "|")
    for family in ("agents", "Mooncake", "ShareGPT", "synthetic"):
        keys = [k for k in base if FAMILIES.get(k[0], "synthetic") == family]
        sums = []
        for other in runs[1:]:
            margins = [100 * (other[k][PLUS] - base[k][PLUS]) for k in keys if k in other]
            sums.append(f"{sum(m > 0.01 for m in margins)} / {sum(m < -0.01 for m in margins)}"
                         f" / {sum(margins):+.2f} / {min(margins, default=0.0):+.2f}")
        print(f"| {family} | " + " | ".join(sums) + " |")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """marconi+'s margin to sglang+ and to the best online system, per configuration, with
    the targets as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['trace'].removeprefix('synthetic:')} {r['capacity'][0]}" for r in rows]
    lru = [100 * (r[PLUS] - r[LRU]) for r in rows]
    best = [100 * (r[PLUS] - max(r[s] for s in ONLINE if s in r)) for r in rows]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.35 * len(rows)), 4.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], lru, 0.4, label="vs sglang+")
    ax.bar([i + 0.2 for i in x], best, 0.4, label="vs the best online system")
    ax.axhline(-0.2, color="C0", linestyle=":", linewidth=1)
    ax.axhline(-0.5, color="C1", linestyle=":", linewidth=1)
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="marconi+'s margin (FLOPs saved, points)",
           title="marconi+ against sglang+ and the best online system (c/m/r: 3/10/30% of "
                 "the footprint)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=TRACES)
    parser.add_argument("--out", type=Path, help="append each row as a JSON line")
    parser.add_argument("--plus", default=PLUS, help="the system measured in marconi+'s "
                        "column (one of its variants: marconi+-overlap, ..., or one of "
                        "bench_plus_variants.py's by name)")
    parser.add_argument("--peers", nargs="+", default=list(ONLINE), choices=ONLINE,
                        help="the online systems it is measured against (default: all)")
    parser.add_argument("--replay", choices=("serving", "sequential"), default="serving",
                        help="how the trace is replayed (default serving)")
    parser.add_argument("--workers", type=int, default=1,
                        help="configurations run at once (processes)")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="F",
                        help="runs' JSON lines: each run's system minus the first's")
    parser.add_argument("--report", type=Path, help="print the table of an earlier --out")
    parser.add_argument("--plot", type=Path, help="draw the margins to this PNG")
    parser.add_argument("--cores", action="store_true", help="replay the --plus system on "
                        "the Python core and on the compiled core: figures compared, CPU time")
    args = parser.parse_args()
    load_variants()  # bench_plus_variants.py's variants run by name
    if args.compare:
        compare(args.compare)
        return
    if args.cores:
        sys.exit(1 if cores(tuple(args.traces), args.plus) else 0)
    if args.report:
        rows = [json.loads(line) for line in args.report.read_text().splitlines() if line]
    else:
        rows = measure(tuple(args.traces), args.out, args.plus, tuple(args.peers),
                       args.replay, args.workers)
    print_table(rows)
    if args.plot is not None:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
