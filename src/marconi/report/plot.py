"""PNG plots of `compare` results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compare_plot(rows: Sequence[dict[str, Any]], path: str | Path, title: str) -> Path:
    """Token hit rate, FLOPs saved and P95 TTFT per system, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["system"] for row in rows]
    panels = (("token hit rate (%)", [100 * r["token_hit_rate"] for r in rows]),
              ("FLOPs saved (%)", [100 * r["flops_saved_rate"] for r in rows]),
              ("P95 TTFT (s)", [r["ttft_p95"] for r in rows]))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (label, values) in zip(axes, panels, strict=True):
        bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
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
