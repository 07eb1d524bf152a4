"""Plain-text tables of `simulate` summaries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marconi.core.units import format_size
from marconi.sim.summary import Summary

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, `Summary` field (else a key of the row's context), format)
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


def _row_cell(summary: Summary, context: Mapping[str, Any], key: str, fmt: str) -> str:
    if key == "alpha":
        if summary.alpha_status == "untuned":
            return "untuned"  # its tuner never finished (never "0.0" as if tuned to zero)
        if summary.alpha_status is None:
            return "-"  # a system without an alpha
    if key in _SERVED_TTFT and summary.served is not None:
        # served: from issue to first token, queueing and batching included
        return _cell(getattr(summary.served, key), fmt)
    value = getattr(summary, key) if key in Summary.__dataclass_fields__ else context.get(key)
    return _cell(value, fmt)


_SERVED_TTFT = ("ttft_p50", "ttft_p95")  # what a served run's table shows of its server


def _rows(summaries: Sequence[Summary], columns: Sequence[tuple[str, str, str]],
          context: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    contexts = list(context) or [{}] * len(summaries)
    return [[_row_cell(summary, more, key, fmt) for _, key, fmt in columns]
            for summary, more in zip(summaries, contexts, strict=True)]


def table(summaries: Sequence[Summary], columns: Sequence[tuple[str, str, str]] = COLUMNS,
          context: Sequence[Mapping[str, Any]] = ()) -> str:
    """Aligned text table, one row per summary; `context` (one mapping per summary, or
    none) holds the columns a summary lacks (a sweep's cell parameters)."""
    cells = [[header for header, _, _ in columns]]
    cells += _rows(summaries, columns, context)
    return align(cells)


def experts(summaries: Sequence[Summary]) -> str:
    """For each marconi+ run, its experts beside it: what each one's shadow saved, the one
    that ran most, the best, its regret against the best and its margin to `sglang+`'s
    configuration, each with the bound its switching rule claims (empty: no such run)."""
    lines = []
    for summary in summaries:
        e = summary.experts
        if e is None:
            continue
        saved = ", ".join(f"{name} {100 * share:.1f}%" for name, share in e.saved.items())
        lines.append(f"{summary.system}'s experts (FLOPs saved by each one's shadow): {saved}")
        sglang = "" if e.sglang_margin is None else (
            f"; against sglang+'s configuration {100 * e.sglang_margin:+.2f} points (bound "
            f"{_points(e.sglang_bound)})")
        estimated = " (sampled shadows: estimates)" if e.sampled else ""
        lines.append(f"  ran most {e.ran_most}; best {e.best}; regret {100 * e.regret:.2f} "
                     f"points (bound {_points(e.bound)}){sglang}{estimated}")
    return "\n".join(lines)


def _points(share: float | None) -> str:
    return "none" if share is None else f"{100 * share:.2f}"


def align(cells: Sequence[Sequence[str]]) -> str:
    """Rows of text cells, the first a header: first column left, others right-aligned."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(summaries: Sequence[Summary],
             columns: Sequence[tuple[str, str, str]] = COLUMNS,
             context: Sequence[Mapping[str, Any]] = ()) -> str:
    """`table` as a markdown table."""
    head = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cells) + " |" for cells in _rows(summaries, columns, context)]
    return "\n".join([head, rule, *body])
