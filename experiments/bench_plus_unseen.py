"""marconi+ on traces built like the sweep's from data its design did not use.

    .venv/bin/python experiments/bench_plus_unseen.py --set design [--systems S ...]
    .venv/bin/python experiments/bench_plus_unseen.py --set heldout     # run once, at the end

Trace keys (`common.unseen_trace`; one process, sequential; results appended as JSON
lines with `--out`):
- `sg(sps=R,skip=K)`: ShareGPT sessions with >= 10 rounds, the K+1-th to the K+100-th
  (the sweep uses the first 100), session i arriving at i / R, times shifted to start at 0;
- `swe(half=even|odd,seed=S,gap=G)`: every other mini-swe-agent trajectory (sorted by
  name; a temporary folder of links, nothing copied), arrival seed S, mean gap G s;
- `mc(a=A,b=B)`: requests A..B of the Mooncake conversation trace.

Columns: FLOPs saved %, the best of sglang+, marconi, marconi-oracle, sglang-2026 and
vllm-2026, `offline`, and the gap closed (marconi+ - X) / (offline - X) against the best
peer and against sglang+. `--systems` takes registered systems and marconi+'s variants
(bench_plus_variants.py). The design set (`common.DESIGN`) reproduces the losses seen on
unseen data (ShareGPT at 5 sessions/s, other trajectories) and serves to choose variants;
the held-out set (`common.HELDOUT`) was fixed before any variant was tried
(experiments/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import DESIGN, HELDOUT, load_variants, unseen_trace

from marconi.core.spec import resolve_model
from marconi.sim.metrics import gap_closed
from marconi.sim.result import SimConfig
from marconi.sim.run import run

PEERS = ("sglang+", "marconi", "marconi-oracle", "sglang-2026", "vllm-2026")
def saved(config: str, system: str) -> tuple[float, float]:
    """(FLOPs saved rate, seconds) of `system` (`name@alpha` fixes alpha) on `config`."""
    key, capacity, *model = config.split("|")
    name, _, alpha = system.partition("@")
    sim = SimConfig(spec=resolve_model(model[0] if model else "paper-7b"), capacity=capacity,
                    system=name, bounds=False, alpha=float(alpha) if alpha else None)
    start = time.perf_counter()
    rate = float(run(unseen_trace(key), sim).summary().flops_saved_rate)
    return rate, time.perf_counter() - start


def table(configs: tuple[str, ...], systems: tuple[str, ...], out: Path | None) -> None:
    rows: dict[str, dict[str, float]] = {}
    for config in configs:
        for system in (*PEERS, "offline", *systems):
            rate, seconds = saved(config, system)
            rows.setdefault(config, {})[system] = rate
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps({"config": config, "system": system, "saved": rate,
                                        "seconds": seconds}) + "\n")
    print("| configuration | best peer | offline | " + " | ".join(
        f"{s} (margin, gap vs best / vs sglang+)" for s in systems) + " |")
    print("|---" * (3 + len(systems)) + "|")
    for config, row in rows.items():
        best = max(PEERS, key=lambda p: row[p])
        cells = []
        for s in systems:
            vs_best = gap_closed(row[s], row[best], row["offline"])
            vs_sglang = gap_closed(row[s], row["sglang+"], row["offline"])
            cells.append(f"{100 * row[s]:.2f} ({100 * (row[s] - row[best]):+.2f}, "
                         f"{_fmt(vs_best)} / {_fmt(vs_sglang)})")
        print(f"| {config} | {best} {100 * row[best]:.2f} | {100 * row['offline']:.2f} | "
              + " | ".join(cells) + " |")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", choices=("design", "heldout"), required=True)
    parser.add_argument("--systems", nargs="+", default=["marconi+"])
    parser.add_argument("--out", type=Path, help="append each run as a JSON line here")
    args = parser.parse_args()
    load_variants()  # the variants (bench_plus_variants.py) run by name
    table(DESIGN if args.set == "design" else HELDOUT, tuple(args.systems), args.out)


if __name__ == "__main__":
    main()
