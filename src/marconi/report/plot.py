"""PNG plots of `compare` results (matplotlib, headless)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compare_plot(rows: Sequence[dict[str, Any]], path: str | Path, title: str,
                 spread: Sequence[dict[str, tuple[float, float]]] | None = None) -> Path:
    """Token hit rate, FLOPs saved and P95 TTFT per system, side by side. `spread`, one
    per row, maps a summary key to its (min, max) over seeds: drawn as error bars."""
    import matplotlib.pyplot as plt

    fig = compare_figure(rows, title, spread)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def check_plot_path(path: str | Path) -> None:
    """ValueError unless matplotlib writes files named like `path` (checked before any
    replay: the figure comes after them all). No suffix: matplotlib's default, PNG."""
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix
    if suffix and suffix[1:].lower() not in kinds:
        raise ValueError(f"--plot: {path}: matplotlib writes no {suffix!r} files; end it in "
                         f"{', '.join('.' + k for k in sorted(kinds))}")


def compare_figure(rows: Sequence[dict[str, Any]], title: str,
                   spread: Sequence[dict[str, tuple[float, float]]] | None = None) -> Any:
    """The figure `compare_plot` writes (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [_label(row) for row in rows]
    panels = (("token hit rate (%)", "token_hit_rate", 100.0),
              ("FLOPs saved (%)", "flops_saved_rate", 100.0), ("P95 TTFT (s)", "ttft_p95", 1.0))
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, (label, key, scale) in zip(axes, panels, strict=True):
        values = [scale * r[key] for r in rows]
        yerr = None
        if spread is not None:
            yerr = [[v - scale * s[key][0] for v, s in zip(values, spread, strict=True)],
                    [scale * s[key][1] - v for v, s in zip(values, spread, strict=True)]]
        where = range(len(names))
        bars = ax.bar(where, values, color=[f"C{i}" for i in where], yerr=yerr,
                      capsize=4 if yerr else 0)
        ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=2)
        ax.set_title(label)
        # level labels, each under its bar, in lines narrow enough not to reach the next
        ax.set_xticks(where, names, fontsize=8)
        top = max([v + (yerr[1][i] if yerr else 0) for i, v in enumerate(values)] or [0])
        ax.set_ylim(0, top * 1.25 if top > 0 else 1)  # room for the values above the bars
    fig.suptitle(title)
    fig.tight_layout()
    if _labels_collide(fig):  # long names: stand them up (a vertical label is one slot wide)
        for ax in fig.axes:
            ax.tick_params(axis="x", labelrotation=90)
        fig.tight_layout()
    return fig


def _labels_collide(fig: Any) -> bool:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        if any(a.overlaps(b) for a, b in itertools.pairwise(boxes)):
            return True
    return False


def _label(row: dict[str, Any]) -> str:
    """The system's name, with its refused commits when it refused any (a run that
    stored little of the trace must not pass for a cache that missed)."""
    refused = row.get("refused_commits") or 0
    if not refused:
        return str(row["system"])
    return f"{row['system']}\nrefused\n{refused}/{row.get('commits', '?')}"
