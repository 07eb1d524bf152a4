"""PNG plots of `compare` results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compare_plot(rows: Sequence[dict[str, Any]], path: str | Path, title: str,
                 spread: Sequence[dict[str, tuple[float, float]]] | None = None) -> Path:
    """Token hit rate, FLOPs saved and P95 TTFT per system, side by side. `spread`, one
    per row, maps a summary key to its (min, max) over seeds: drawn as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [_label(row) for row in rows]
    panels = (("token hit rate (%)", "token_hit_rate", 100.0),
              ("FLOPs saved (%)", "flops_saved_rate", 100.0), ("P95 TTFT (s)", "ttft_p95", 1.0))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (label, key, scale) in zip(axes, panels, strict=True):
        values = [scale * r[key] for r in rows]
        yerr = None
        if spread is not None:
            yerr = [[v - scale * s[key][0] for v, s in zip(values, spread, strict=True)],
                    [scale * s[key][1] - v for v, s in zip(values, spread, strict=True)]]
        bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))], yerr=yerr,
                      capsize=4 if yerr else 0)
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _label(row: dict[str, Any]) -> str:
    """The system's name, with its refused commits when it refused any (a run that
    stored little of the trace must not pass for a cache that missed)."""
    refused = row.get("refused_commits") or 0
    if not refused:
        return str(row["system"])
    return f"{row['system']}\nrefused {refused}/{row.get('commits', '?')}"
