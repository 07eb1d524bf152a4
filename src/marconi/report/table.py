"""Plain-text tables of `simulate` summaries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marconi.core.units import format_size

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, summary key, format)
    ("system", "system", "s"),
    ("token hit", "token_hit_rate", "%"),
    ("req hit", "request_hit_rate", "%"),
    ("FLOPs saved", "flops_saved_rate", "%"),
    ("TTFT p50 s", "ttft_p50", ".3f"),
    ("TTFT p95 s", "ttft_p95", ".3f"),
    ("alpha", "alpha", ".1f"),
    ("states in", "states_admitted", "d"),
    ("evictions", "evictions", "d"),
    ("refused", "refused_commits", "d"),  # commits bypassed: too big for the capacity
    ("peak", "peak_bytes", "bytes"),
    ("replay s", "seconds", ".2f"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "%":
        return f"{100 * value:.1f}%"
    if fmt == "bytes":
        return format_size(value)
    return format(value, fmt)


def _row_cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if key == "alpha" and "alpha_status" in row:
        if row["alpha_status"] == "untuned":
            return "untuned"  # its tuner never finished (never "0.0" as if tuned to zero)
        if row["alpha_status"] is None:
            return "-"  # a system without an alpha
    return _cell(row.get(key), fmt)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]] = COLUMNS) -> str:
    """Aligned text table, one row per summary."""
    cells = [[header for header, _, _ in columns]]
    cells += [[_row_cell(row, key, fmt) for _, key, fmt in columns] for row in rows]
    return align(cells)


def align(cells: Sequence[Sequence[str]]) -> str:
    """Rows of text cells, the first a header: first column left, others right-aligned."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: Sequence[dict[str, Any]],
             columns: Sequence[tuple[str, str, str]] = COLUMNS) -> str:
    head = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_row_cell(row, k, f) for _, k, f in columns) + " |"
            for row in rows]
    return "\n".join([head, rule, *body])
