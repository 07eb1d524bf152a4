"""Grouping sweep rows for figures: variants, paired configurations, markdown tables."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from marconi.systems import SYSTEMS

Row = dict[str, Any]
# Everything that defines a configuration except the caching system and its alpha settings:
# rows with equal keys are the same workload, model and capacity, so their systems compare.
CONFIG_FIELDS = ("dataset", "trace", "capacity", "model", "sessions", "max_requests", "sps",
                 "response_time", "mean_gap", "seed", "tokenizer")
DEFAULT_MULTIPLIER = 5


def variant(row: Row) -> str:
    """`marconi`, `marconi a=1`, `marconi m=15`, `sglang+`: a system with its alpha setting."""
    system = row["system"]
    info = SYSTEMS.get(system)
    if info is None or not info.uses_alpha:
        return str(system)
    if row.get("alpha_fixed") is not None:
        return f"{system} a={row['alpha_fixed']:g}"
    if info.tuned and row.get("multiplier", DEFAULT_MULTIPLIER) != DEFAULT_MULTIPLIER:
        return f"{system} m={row['multiplier']}"
    return str(system)


def config_key(row: Row) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in CONFIG_FIELDS)


def ordered(values: Iterable[Any]) -> list[Any]:
    """Distinct values in first-seen order."""
    return list(dict.fromkeys(values))


def by_config(rows: Iterable[Row]) -> dict[tuple[Any, ...], dict[str, Row]]:
    """{configuration: {variant: row}}, configurations in first-seen order."""
    out: dict[tuple[Any, ...], dict[str, Row]] = {}
    for row in rows:
        out.setdefault(config_key(row), {})[variant(row)] = row
    return out


def datasets(rows: Sequence[Row]) -> list[str]:
    return ordered(str(r["dataset"] or r["trace"]) for r in rows)


def of_dataset(rows: Sequence[Row], name: str) -> list[Row]:
    return [r for r in rows if str(r["dataset"] or r["trace"]) == name]


def paired(rows: Sequence[Row], name: str, base: str,
           fn: Callable[[Row, Row], float | None]) -> list[float]:
    """fn(row of `name`, row of `base`) over configurations holding both (None skipped)."""
    out = []
    for group in by_config(rows).values():
        if name in group and base in group:
            value = fn(group[name], group[base])
            if value is not None:
                out.append(value)
    return out


def ratio(key: str) -> Callable[[Row, Row], float | None]:
    def fn(a: Row, b: Row) -> float | None:
        return a[key] / b[key] if b[key] else None

    return fn


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{format(value, spec)}{suffix}"


def md_table(header: Sequence[str], body: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def refusal_note(rows: Sequence[Row], share: float = 0.0) -> str:
    """A note naming every system that refused more than `share` of its commits on some
    configuration (those sequences were bypassed, too big for the capacity), with how
    many configurations and the worst share; empty when none did."""
    worst: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        commits, refused = row.get("commits") or 0, row.get("refused_commits") or 0
        if commits and refused > share * commits:
            key = (str(row.get("dataset", row.get("trace"))), variant(row))
            worst.setdefault(key, []).append(refused / commits)
    if not worst:
        return ""
    parts = [f"{system} on {dataset}: {len(v)} configuration(s), up to {100 * max(v):.1f}%"
             for (dataset, system), v in sorted(worst.items())]
    return ("\n\nRefused commits (sequences too big for the capacity, bypassed and not "
            "cached; their hit rates count them as misses): " + "; ".join(parts) + ".")
