"""Figures that look inside runs: Fig 10 (per-request records) and the tuner study."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from marconi.report.grouping import (
    Row,
    by_config,
    config_key,
    datasets,
    fmt,
    md_table,
    of_dataset,
    ordered,
    variant,
)

Records = Callable[[str], dict[str, np.ndarray]]
# input-length bins of Fig 10a (tokens); the paper's crossover sits near 7K
LENGTH_EDGES = (0, 1000, 2000, 4000, 7000, 10000, 16000, 32768)


def length_bins(rows: list[Row], options: Mapping[str, Any],
                records: Records) -> tuple[Figure, str]:
    """Fig 10: (a) hit rate difference by input length, (b) TTFT CDF, pooled over configs."""
    ref, base = options.get("system", "marconi"), options.get("baseline", "sglang+")
    edges = tuple(options.get("edges", LENGTH_EDGES))
    pooled = _pool([r for r in rows if r.get("records")], records)
    fig = Figure(figsize=(11, 3.8))
    ax_a, ax_b = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    table = _bin_table(pooled, ref, base, edges, ax_a)
    for name, rec in pooled.items():
        t = np.sort(rec["ttft_s"]) * 1000
        ax_b.plot(t, np.arange(1, t.size + 1) / max(t.size, 1), label=name)
    ax_b.set(xscale="log", xlabel="TTFT (ms)", ylabel="CDF over requests", title="(b) TTFT")
    ax_b.legend(fontsize=7)
    return fig, table + "\n\n" + _ttft_table(pooled, ref, base)


def _pool(rows: list[Row], records: Records) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, list[dict[str, np.ndarray]]] = {}
    for row in rows:
        out.setdefault(variant(row), []).append(records(row["cell_id"]))
    return {v: {k: np.concatenate([r[k] for r in recs]) for k in recs[0]}
            for v, recs in out.items()}


def _bin_rates(rec: dict[str, np.ndarray], edges: tuple[int, ...]) -> list[float | None]:
    n, hit, out = rec["n_input"], rec["hit"], []
    for lo, hi in itertools.pairwise(edges):
        mask = (n >= lo) & (n < hi)
        out.append(float(hit[mask].sum() / n[mask].sum()) if n[mask].sum() else None)
    return out


def _bin_table(pooled: dict[str, dict[str, np.ndarray]], ref: str, base: str,
               edges: tuple[int, ...], ax: Any) -> str:
    if ref not in pooled or base not in pooled:
        return f"(no records for both {ref} and {base})"
    a, b = _bin_rates(pooled[ref], edges), _bin_rates(pooled[base], edges)
    labels = [f"{lo / 1000:g}-{hi // 1000}K" for lo, hi in itertools.pairwise(edges)]
    diff = [100 * (x - y) if x is not None and y is not None else np.nan
            for x, y in zip(a, b, strict=True)]
    ax.bar(labels, diff, color=["C3" if d < 0 else "C2" for d in diff])
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(title=f"(a) {ref} - {base} hit rate", ylabel="token hit rate diff (pp)",
           xlabel="input length")
    ax.tick_params(axis="x", rotation=30)
    n = pooled[ref]["n_input"]
    counts = [int(((n >= lo) & (n < hi)).sum()) for lo, hi in itertools.pairwise(edges)]
    body = [[lab, c, fmt(None if x is None else 100 * x), fmt(None if y is None else 100 * y),
             fmt(None if np.isnan(d) else d, "+.1f")]
            for lab, c, x, y, d in zip(labels, counts, a, b, diff, strict=True)]
    return md_table(["input length", "requests", f"{ref} hit %", f"{base} hit %", "diff (pp)"],
                    body)


def _ttft_table(pooled: dict[str, dict[str, np.ndarray]], ref: str, base: str) -> str:
    body = []
    for name, rec in pooled.items():
        p = np.percentile(rec["ttft_s"] * 1000, [5, 50, 95]) if rec["ttft_s"].size else [0] * 3
        body.append([name, *(f"{v:.1f}" for v in p)])
    if ref in pooled and base in pooled:
        r, b = (np.percentile(pooled[x]["ttft_s"] * 1000, [5, 50, 95]) for x in (ref, base))
        body.append([f"{ref} vs {base}", *(f"{100 * (x / y - 1):+.1f}% ({x - y:+.1f} ms)"
                                           for x, y in zip(r, b, strict=True))])
    return md_table(["system", "TTFT P5 ms", "P50 ms", "P95 ms"], body)


def tuner(rows: list[Row], options: Mapping[str, Any], records: Records) -> tuple[Figure, str]:
    """Tuner study: bootstrap alpha (m=5, 15) vs fixed alphas vs the best static alpha."""
    best = options.get("oracle", "marconi-oracle")
    metric = options.get("metric", "flops_saved_rate")
    names = datasets(rows)
    fig = Figure(figsize=(11, 3.8))
    ax_a, ax_b = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    variants = [v for v in ordered(variant(r) for r in rows) if v != best]
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        shares = [_mean_share(of_dataset(rows, d), v, best, metric) for d in names]
        ax_a.bar(np.arange(len(names)) + i * width, [100 * (s or 0) for s in shares], width,
                 label=v)
    ax_a.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    ax_a.set(ylabel=f"{metric} / oracle's (%)", ylim=(0, 105), title="(a) share of the oracle")
    ax_a.legend(fontsize=7, loc="lower left")
    _alpha_scatter(rows, best, ax_b)
    return fig, _tuner_table(rows, variants, best, metric)


def _mean_share(rows: list[Row], name: str, best: str, metric: str) -> float | None:
    shares = [g[name][metric] / g[best][metric] for g in by_config(rows).values()
              if name in g and best in g and g[best][metric]]
    return float(np.mean(shares)) if shares else None


def _alpha_scatter(rows: list[Row], best: str, ax: Any) -> None:
    for name in ordered(variant(r) for r in rows if r.get("tuning_window") is not None):
        pairs = [(g[best]["alpha"], g[name]["alpha"]) for g in by_config(rows).values()
                 if name in g and best in g and g[name]["alpha"] is not None]  # untuned: no point
        if pairs:
            ax.scatter(*zip(*pairs, strict=True), label=name, alpha=0.7)
    ax.plot([0, 2], [0, 2], color="grey", lw=0.8)
    ax.set(xlabel="best static alpha (oracle)", ylabel="bootstrap alpha",
           title="(b) alpha chosen per configuration")
    if ax.collections:
        ax.legend(fontsize=7)
    else:  # every bootstrap run left untuned: nothing to place
        ax.text(0.5, 0.5, "no tuning finished", transform=ax.transAxes, ha="center")


def _tuner_table(rows: list[Row], variants: list[str], best: str, metric: str) -> str:
    body = []
    for group in by_config(rows).values():
        first = next(iter(group.values()))
        cells = [_cell(group.get(v), metric) for v in [*variants, best]]
        body.append([first["dataset"], first["capacity"], *cells])
    means = [fmt(_pct(_mean_share(rows, v, best, metric))) for v in variants]
    body.append(["mean share of oracle", "", *[f"{m}%" for m in means], "100%"])
    header = ["dataset", "capacity", *[f"{v}: {metric} % (alpha)" for v in [*variants, best]]]
    return md_table(header, body)


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _cell(row: Row | None, metric: str) -> str:
    if row is None:
        return "-"
    alpha = "untuned" if row.get("alpha") is None else f"{row['alpha']:g}"
    return f"{100 * row[metric]:.1f} ({alpha})"


__all__ = ["config_key", "length_bins", "tuner"]
