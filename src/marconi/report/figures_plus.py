"""marconi+ against the best peer on every configuration of the sweep.

For each configuration (workload, model, capacity) holding marconi+, the offline reference
and at least one peer: the margin over the best peer (FLOPs saved, percentage points) and
the share of the gap from the best peer to `offline` that marconi+ closes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from marconi.report.grouping import Row, by_config, fmt, md_table, ordered, pct
from marconi.sim.metrics import gap_closed

Records = Callable[[str], dict[str, np.ndarray]]
PEERS = ("sglang+", "sglang-2026", "vllm-2026", "marconi")
TIE = 0.01  # percentage points: margins this small count as ties (the table's precision)
MIN_GAP = 0.1  # percentage points: a smaller gap to offline has no meaningful share


class Versus(NamedTuple):
    """One configuration: marconi+ beside its best peer and the offline reference."""

    row: Row  # marconi+'s row (the configuration's fields)
    best: str  # the peer saving the most
    peer: float  # the best peer's metric, %
    plus: float  # marconi+'s, %
    offline: float  # the reference's, %
    sglang: float | None  # sglang+'s, % (the convention of the benchmark table)

    @property
    def margin(self) -> float:
        return self.plus - self.peer

    def gap(self, baseline: float | None) -> float | None:
        """Share of the gap from `baseline` to offline closed; None below 0.1 pp of gap,
        where the share is noise (offline, a heuristic, can also trail the baseline)."""
        if baseline is None or self.offline - baseline < MIN_GAP:
            return None
        return gap_closed(self.plus, baseline, self.offline)


def plus_vs_peers(rows: list[Row], options: Mapping[str, Any],
                  records: Records) -> tuple[Figure, str]:
    """marconi+ minus the best peer, and the gap to offline it closes, per configuration."""
    found = compare(rows, options)
    tie = float(options.get("tie", TIE))
    fig = Figure(figsize=(12, 4))
    _margins(found, fig.add_subplot(1, 2, 1))
    _gaps(found, fig.add_subplot(1, 2, 2))
    return fig, _summary(found, tie) + "\n\n" + _details(found, options)


def compare(rows: list[Row], options: Mapping[str, Any]) -> list[Versus]:
    """Every configuration with marconi+, the reference and a peer, in first-seen order."""
    name, ref = options.get("system", "marconi+"), options.get("reference", "offline")
    peers, metric = options.get("peers", PEERS), options.get("metric", "flops_saved_rate")
    out = []
    for group in by_config(rows).values():
        present = [p for p in peers if p in group]
        if name not in group or ref not in group or not present:
            continue
        best = max(present, key=lambda p: group[p][metric])
        sglang = group.get("sglang+")
        out.append(Versus(row=group[name], best=best, peer=100 * group[best][metric],
                          plus=100 * group[name][metric], offline=100 * group[ref][metric],
                          sglang=None if sglang is None else 100 * sglang[metric]))
    return out


def _dataset(v: Versus) -> str:
    return str(v.row["dataset"] or v.row["trace"])


def _summary(found: list[Versus], tie: float) -> str:
    body = []
    for name in [*ordered(_dataset(v) for v in found), "all"]:
        mine = [v for v in found if name in ("all", _dataset(v))]
        margins = [v.margin for v in mine]
        gaps = [g for v in mine if (g := v.gap(v.peer)) is not None]
        body.append([name, len(mine), sum(m > tie for m in margins),
                     sum(abs(m) <= tie for m in margins), sum(m < -tie for m in margins),
                     fmt(min(margins, default=None), "+.2f"),
                     fmt(max(margins, default=None), "+.2f"),
                     fmt(pct(gaps, 50), "+.3f"), fmt(max(gaps, default=None), "+.3f")])
    header = ["dataset", "configs", "wins", f"ties (|margin| <= {tie:g})", "losses",
              "worst margin (pp)", "best margin (pp)", "median gap closed", "max gap closed"]
    return md_table(header, body)


def _label(row: Row, options: Mapping[str, Any]) -> str:
    labels = options.get("labels", {})
    parts = [str(row["capacity"])]
    if row["model"] != "paper-7b":
        parts.append(str(labels.get(row["model"], row["model"])))
    if row["dataset"] not in options.get("timestamped", ()):
        parts.append(f"{row['sps']:g} sps")
    if row.get("response_time"):
        parts.append(f"rt {row['response_time']:g} s")
    return ", ".join(parts)


def _details(found: list[Versus], options: Mapping[str, Any]) -> str:
    body = [[_dataset(v), _label(v.row, options), f"{v.best} {v.peer:.2f}", f"{v.plus:.2f}",
             f"{v.margin:+.2f}", f"{v.offline:.2f}", fmt(v.gap(v.peer), "+.3f"),
             fmt(v.gap(v.sglang), "+.3f")] for v in found]
    header = ["dataset", "configuration", "best peer (FLOPs saved %)", "marconi+ %",
              "margin (pp)", "offline %", "gap closed vs best peer", "gap closed vs sglang+"]
    return md_table(header, body)


def _margins(found: list[Versus], ax: Any) -> None:
    names = ordered(_dataset(v) for v in found)
    ranked = sorted(found, key=lambda v: v.margin)
    colors = [f"C{names.index(_dataset(v))}" for v in ranked]
    ax.bar(range(len(ranked)), [v.margin for v in ranked], color=colors)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="configuration (sorted)", ylabel="marconi+ - best peer (FLOPs saved, pp)",
           title="(a) margin over the best peer")
    ax.legend([Patch(color=f"C{i}") for i in range(len(names))], names, fontsize=7)


def _gaps(found: list[Versus], ax: Any) -> None:
    for i, name in enumerate(ordered(_dataset(v) for v in found)):
        mine = [v for v in found if _dataset(v) == name]
        ax.scatter([v.peer for v in mine], [v.plus for v in mine], color=f"C{i}", label=name,
                   s=18)
        ax.scatter([v.peer for v in mine], [v.offline for v in mine], color=f"C{i}",
                   marker="x", s=18)
    top = max((v.offline for v in found), default=100.0)
    ax.plot([0, top], [0, top], color="grey", lw=0.8)
    ax.set(xlabel="best peer: FLOPs saved (%)", ylabel="FLOPs saved (%)",
           title="(b) marconi+ (dots) and offline (x) vs the best peer")
    ax.legend(fontsize=7)


__all__ = ["PEERS", "Versus", "compare", "plus_vs_peers"]
