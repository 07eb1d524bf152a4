"""marconi+ on traces built like the sweep's from data its design did not use.

    .venv/bin/python experiments/bench_plus_unseen.py --set design [--systems S ...]
    .venv/bin/python experiments/bench_plus_unseen.py --set heldout     # run once, at the end
    .venv/bin/python experiments/bench_plus_unseen.py --set heldout --replay serving
    .venv/bin/python experiments/bench_plus_unseen.py --set fresh --all --out F.jsonl [--part 1/2]
    .venv/bin/python experiments/bench_plus_unseen.py --report F.jsonl [G.jsonl ...] [--plot F.png]

Trace keys (`common.unseen_trace`; one process, sequential; results appended as JSON
lines with `--out`):
- `sg(sps=R,skip=K)`: ShareGPT sessions with >= 10 rounds, the K+1-th to the K+100-th
  (the sweep uses the first 100), session i arriving at i / R, times shifted to start at 0;
- `swe(half=even|odd,seed=S,gap=G)`: every other mini-swe-agent trajectory (sorted by
  name; a temporary folder of links, nothing copied), arrival seed S, mean gap G s;
- `mc(a=A,b=B)`: requests A..B of the Mooncake conversation trace; `mcs(a=A,b=B)`: of
  Mooncake's synthetic trace.

Columns: FLOPs saved %, the best of sglang+, marconi, marconi-oracle, sglang-2026 and
vllm-2026, `offline`, and the gap closed (marconi+ - X) / (offline - X) against the best
peer and against sglang+. `--systems` takes registered systems and marconi+'s variants
(bench_plus_variants.py). The design set (`common.DESIGN`) reproduces the losses seen on
unseen data (ShareGPT at 5 sessions/s, other trajectories) and serves to choose variants;
the held-out set (`common.HELDOUT`) was fixed before any variant was tried
(experiments/RESULTS.md). The fresh set (`common.FRESH`) was written down before it was
run, from data no earlier set used, and run once with `--all`: every registered system
that runs in process (not the two real engines), marconi+'s ablations, and the three
references that know the future (`FUTURE`). `--part K/N` runs every N-th configuration
from the K-th, so that N processes share a run; `--report` reads the JSON lines of one or
more runs back and prints marconi+ against the best registered system without future
knowledge, then every run, with each candidate's (marconi+, its ablations, the plugin's
variants) margins to that best.

The replay is the paper's sequential one (marconi's tuner tuning once), as every table
these commands recorded. `--replay serving` replays as a server runs the trace, with the
shipped settings (marconi re-tuning); `offline` reads the sequential future and refuses
that replay, so the reference of the gap closed is `marconi-oracle` (served, the best
fixed alpha in hindsight), and `--all` is refused.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import DESIGN, FRESH, HELDOUT, load_variants, unseen_trace

from marconi.core.spec import resolve_model
from marconi.sim.metrics import gap_closed
from marconi.sim.result import OFFLINE, ORACLE, REUSE_ORACLE, SimConfig
from marconi.sim.run import run
from marconi.systems import SYSTEMS

PEERS = ("sglang+", "marconi", "marconi-oracle", "sglang-2026", "vllm-2026")
SETS = {"design": DESIGN, "heldout": HELDOUT, "fresh": FRESH}
FUTURE = (ORACLE, OFFLINE, REUSE_ORACLE)  # they read the whole trace before replaying it
# every system the project registers that runs in process, taken before the variants'
# plugin adds its own; the real engines (`engine` set) need their own environments
REGISTERED = tuple(name for name, s in SYSTEMS.items() if s.engine is None)
PLUS = "marconi+"
def saved(config: str, system: str, replay: str = "sequential") -> tuple[float, float]:
    """(FLOPs saved rate, seconds) of `system` (`name@alpha` fixes alpha) on `config`,
    sequential with marconi's tuner tuning once, or served with the shipped settings."""
    key, capacity, *model = config.split("|")
    name, _, alpha = system.partition("@")
    pinned = {"replay": "sequential", "retune": False} if replay == "sequential" else {}
    sim = SimConfig(spec=resolve_model(model[0] if model else "paper-7b"), capacity=capacity,
                    system=name, bounds=False, alpha=float(alpha) if alpha else None,
                    **pinned)  # type: ignore[arg-type]
    start = time.perf_counter()
    rate = float(run(unseen_trace(key), sim).summary().flops_saved_rate)
    return rate, time.perf_counter() - start


def table(configs: tuple[str, ...], systems: tuple[str, ...], out: Path | None,
          everything: bool = False, replay: str = "sequential") -> None:
    rows: dict[str, dict[str, float]] = {}
    reference = OFFLINE if replay == "sequential" else ORACLE  # the served one: no future
    for config in configs:
        run_now = (*REGISTERED, *FUTURE) if everything else (*PEERS, reference, *systems)
        for system in dict.fromkeys(run_now):
            started = time.strftime("%H:%M:%S")
            rate, seconds = saved(config, system, replay)
            print(f"[{started}] {config} {system}: {100 * rate:.2f}% in {seconds:.0f} s",
                  flush=True)
            rows.setdefault(config, {})[system] = rate
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps({"config": config, "system": system, "saved": rate,
                                        "seconds": seconds, "replay": replay}) + "\n")
    if everything:
        return  # `--report` reads the lines back
    print(f"{replay} replay; gap closed toward {reference}")
    print(f"| configuration | best peer | {reference} | " + " | ".join(
        f"{s} (margin, gap vs best / vs sglang+)" for s in systems) + " |")
    print("|---" * (3 + len(systems)) + "|")
    for config, row in rows.items():
        best = max((p for p in PEERS if p != reference), key=lambda p: row[p])
        cells = []
        for s in systems:
            vs_best = gap_closed(row[s], row[best], row[reference])
            vs_sglang = gap_closed(row[s], row["sglang+"], row[reference])
            cells.append(f"{100 * row[s]:.2f} ({100 * (row[s] - row[best]):+.2f}, "
                         f"{_fmt(vs_best)} / {_fmt(vs_sglang)})")
        print(f"| {config} | {best} {100 * row[best]:.2f} | {100 * row[reference]:.2f} | "
              + " | ".join(cells) + " |")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def read_runs(paths: list[Path]) -> dict[str, dict[str, float]]:
    """{configuration: {system: FLOPs saved rate}} from `--out` JSON lines of sequential
    runs (a line without `replay` is one); a bad line is an error naming the file and the
    line, and so are a served run (its references differ) and a run two files disagree on."""
    rows: dict[str, dict[str, float]] = {}
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                run_ = json.loads(line)
                config, system = str(run_["config"]), str(run_["system"])
                rate = float(run_["saved"])
                replay = str(run_.get("replay", "sequential"))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise SystemExit(f"{path}:{number}: not a run of this script ({err!r})") \
                    from None
            if replay != "sequential":
                raise SystemExit(f"{path}:{number}: a {replay} run; --report compares "
                                 "sequential runs against the references that read their "
                                 "future (the table of a served run prints as it runs)")
            known = rows.setdefault(config, {}).setdefault(system, rate)
            if known != rate:
                raise SystemExit(f"{path}:{number}: {system} on {config} saved {rate!r} "
                                 f"here and {known!r} in an earlier line")
    return rows


def is_peer(system: str) -> bool:
    """A registered system without future knowledge, marconi+ and its ablations aside; the
    plugin's variants are candidates beside marconi+, not peers."""
    return system in REGISTERED and not system.startswith(PLUS)


def online(row: dict[str, float]) -> dict[str, float]:
    """The runs of the peers (`is_peer`) in one configuration's row."""
    return {s: v for s, v in row.items() if is_peer(s)}


def report(paths: list[Path], plot: Path | None) -> None:
    rows = read_runs(paths)
    missing = [f"{c}: {s}" for c, row in rows.items()
               for s in (PLUS, "sglang+", *FUTURE) if s not in row]
    if missing:
        raise SystemExit(f"{', '.join(map(str, paths))}: runs missing: {', '.join(missing)}")
    print("| configuration | online systems | best online (not marconi+) | marconi+ | margin "
          "| best marconi+ ablation | reuse-oracle | gap to reuse-oracle closed: from the "
          "best / from sglang+ | marconi-oracle | marconi+ / marconi-oracle | offline |")
    print("|---" * 11 + "|")
    margins, from_best, from_sglang = [], [], []
    strict: list[float] = []  # against its own registered ablations too
    notes: list[str] = []
    for config, row in rows.items():
        others = online(row)
        best = max(others, key=lambda s: others[s])
        ablations = {s: v for s, v in row.items() if s.startswith(PLUS + "-")}
        ablation = max(ablations, key=lambda s: ablations[s]) if ablations else None
        plus, reuse = row[PLUS], row[REUSE_ORACLE]
        # below an online system, reuse-oracle is no upper reference: no gap to it
        no_reference = reuse <= others[best]
        gaps = ((None, None) if no_reference else
                (gap_closed(plus, others[best], reuse), gap_closed(plus, row["sglang+"], reuse)))
        margins.append(100 * (plus - others[best]))
        strict.append(100 * (plus - max([others[best], *ablations.values()])))
        from_best.append(gaps[0])
        from_sglang.append(gaps[1])
        ratio = f"{plus / row[ORACLE]:.3f}" if row[ORACLE] > 0 else "-"
        shown_ablation = (f"{ablation} {100 * ablations[ablation]:.2f}"
                          if ablation is not None else "-")
        shown = config.replace("|", " ")  # a bar would split the markdown cell
        if no_reference:
            notes.append(f"{shown}: reuse-oracle saves {100 * reuse:.2f}%, less than "
                         f"{best}'s {100 * others[best]:.2f}%: it is no upper reference here "
                         "and no gap to it is measured")
        print(f"| {shown} | {len(others)} | {best} {100 * others[best]:.2f} | "
              f"{100 * plus:.2f} | {100 * (plus - others[best]):+.2f} | {shown_ablation} | "
              f"{100 * reuse:.2f} | {_fmt(gaps[0])} / {_fmt(gaps[1])} | "
              f"{100 * row[ORACLE]:.2f} | {ratio} | {100 * row[OFFLINE]:.2f} |")
    wins = sum(m > 0.01 for m in margins)
    losses = [m for m in margins if m < -0.2]
    print(f"\nmarconi+ above the best online system on {wins} of {len(margins)}, more than "
          f"0.2 point below on {len(losses)} (worst {min(margins):+.2f}); gap to reuse-oracle "
          f"closed on average: {_mean(from_best)} from the best, {_mean(from_sglang)} from "
          "sglang+")
    for note in notes:
        print(f"warning: {note}")
    print(f"counting marconi+'s registered ablations as systems too: more than 0.2 point "
          f"below on {sum(m < -0.2 for m in strict)} of {len(strict)} (worst "
          f"{min(strict):+.2f})")
    every_run(rows)
    if plot is not None:
        _plot(list(rows), margins, from_sglang, plot)


def every_run(rows: dict[str, dict[str, float]]) -> None:
    """Every system's FLOPs saved % per configuration; for each candidate (marconi+, its
    ablations, the plugin's variants) how often it is more than 0.2 point below the best
    online system, its worst margin and the sum of its margins."""
    configs = list(rows)
    systems = list(dict.fromkeys(s for row in rows.values() for s in row))
    best = {c: max(online(rows[c]).values()) for c in configs}
    print("\n| system | " + " | ".join(c.replace("|", " ") for c in configs)
          + " | more than 0.2 below the best online / worst / sum of margins |")
    print("|---" * (len(configs) + 2) + "|")
    for system in systems:
        saved_ = [rows[c].get(system) for c in configs]
        cells = ["-" if v is None else f"{100 * v:.2f}" for v in saved_]
        summary = ""
        if system not in FUTURE and not is_peer(system):
            margins = [100 * (v - best[c]) for c, v in zip(configs, saved_, strict=True)
                       if v is not None]
            summary = (f"{sum(m < -0.2 for m in margins)} of {len(margins)} / "
                       f"{min(margins):+.2f} / {sum(margins):+.2f}")
        print(f"| {system} | " + " | ".join(cells) + f" | {summary} |")


def _mean(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):+.2f} over {len(known)}" if known else "-"


def _plot(configs: list[str], margins: list[float], gaps: list[float | None],
          path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = [c.replace("|paper-7b,ssm=24,attn=12,mlp=36", " 24:12") for c in configs]
    y = range(len(configs))
    left.barh(y, margins, color=["tab:green" if m >= -0.2 else "tab:red" for m in margins])
    left.axvline(-0.2, color="grey", linestyle=":", linewidth=1)
    left.set_yticks(list(y), names, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("marconi+ - best online system (FLOPs saved, points)")
    right.barh(y, [0.0 if g is None else g for g in gaps], color="tab:blue")
    right.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    for i, gap in enumerate(gaps):
        if gap is None:
            right.text(0.01, i, "none: reuse-oracle is below an online system", va="center",
                       fontsize=7, color="grey")
    right.set_yticks(list(y), [""] * len(configs))
    right.invert_yaxis()
    right.set_xlabel("gap from sglang+ to reuse-oracle closed by marconi+")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", choices=tuple(SETS))
    parser.add_argument("--systems", nargs="+", default=["marconi+"])
    parser.add_argument("--all", action="store_true",
                        help="every in-process registered system and the references")
    parser.add_argument("--part", default="1/1", metavar="K/N",
                        help="run the K-th of every N configurations (default 1/1)")
    parser.add_argument("--out", type=Path, help="append each run as a JSON line here")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSONL",
                        help="print marconi+ against the best online system from these runs")
    parser.add_argument("--plot", type=Path, help="with --report: a figure of the margins")
    parser.add_argument("--replay", default="sequential", choices=("sequential", "serving"),
                        help="the replay protocol (module docstring)")
    args = parser.parse_args()
    if args.all and args.replay == "serving":
        parser.error("--all runs the references that read the sequential future, which "
                     "refuse the serving replay: drop --all or use --replay sequential")
    if args.report is not None:
        report(args.report, args.plot)
        return
    if args.set is None:
        parser.error("give --set or --report")
    try:
        k, n = (int(x) for x in args.part.split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        parser.error(f"--part: expected K/N with 1 <= K <= N, got {args.part!r}")
    load_variants()  # the variants (bench_plus_variants.py) run by name
    table(SETS[args.set][k - 1::n], tuple(args.systems), args.out, everything=args.all,
          replay=args.replay)


if __name__ == "__main__":
    main()
