"""The paper's figures from sweep rows: each a function (rows, options, records) ->
(matplotlib Figure, markdown table), registered by name in `FIGURES`.

`records(cell_id)` loads the per-request arrays of a cell run with `records = true`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from marconi.report.figures_detail import length_bins, tuner
from marconi.report.figures_plus import plus_vs_peers
from marconi.report.grouping import (
    Row,
    by_config,
    datasets,
    fmt,
    md_table,
    of_dataset,
    ordered,
    paired,
    pct,
    ratio,
    refusal_note,
    variant,
)

Records = Callable[[str], dict[str, np.ndarray]]
FigureFn = Callable[[list[Row], Mapping[str, Any], Records], tuple[Figure, str]]


def _panels(n: int, width: float = 4.6, height: float = 3.6) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(width * n, height))
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def hit_rate(rows: list[Row], options: Mapping[str, Any], records: Records) -> tuple[Figure, str]:
    """Fig 7: token hit rate per system across the sweep (box: P5..P95 whiskers)."""
    base = options.get("baseline", "vllm+")
    names = datasets(rows)
    fig, axes = _panels(len(names))
    body = []
    for ax, name in zip(axes, names, strict=True):
        mine = of_dataset(rows, name)
        variants = ordered(variant(r) for r in mine)
        values = [[100 * r["token_hit_rate"] for r in mine if variant(r) == v] for v in variants]
        ax.boxplot(values, whis=(5, 95), showfliers=False)
        ax.set_xticks(range(1, len(variants) + 1), variants, rotation=30, ha="right")
        ax.set(title=name, ylabel="token hit rate (%)")
        for v, vals in zip(variants, values, strict=True):
            gains = paired(mine, v, base, ratio("token_hit_rate"))
            body.append([name, v, len(vals), fmt(np.mean(vals)), fmt(pct(vals, 50)),
                         fmt(pct(vals, 95)), fmt(np.mean(gains) if gains else None, ".2f", "x"),
                         fmt(pct(gains, 50), ".2f", "x")])
    header = ["dataset", "system", "configs", "mean hit %", "P50 hit %", "P95 hit %",
              f"mean x {base}", f"P50 x {base}"]
    return fig, md_table(header, body)


def gain(rows: list[Row], options: Mapping[str, Any], records: Records) -> tuple[Figure, str]:
    """Fig 8: each system's token-hit-rate gain over a baseline (SGLang+), per config."""
    base = options.get("baseline", "sglang+")
    skip = {base, *options.get("exclude", ["vanilla", "vllm+"])}
    names = datasets(rows)
    fig, axes = _panels(len(names))
    body = []
    for ax, name in zip(axes, names, strict=True):
        mine = of_dataset(rows, name)
        variants = [v for v in ordered(variant(r) for r in mine) if v not in skip]
        gains = [[100 * (g - 1) for g in paired(mine, v, base, ratio("token_hit_rate"))]
                 for v in variants]
        ax.boxplot(gains, whis=(5, 95), showfliers=True)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(1, len(variants) + 1), variants, rotation=30, ha="right")
        ax.set(title=name, ylabel=f"token hit rate gain over {base} (%)")
        for v, g in zip(variants, gains, strict=True):
            body.append([name, v, len(g), fmt(pct(g, 5), "+.1f", "%"), fmt(pct(g, 50), "+.1f", "%"),
                         fmt(np.mean(g) if g else None, "+.1f", "%"),
                         fmt(pct(g, 95), "+.1f", "%"), fmt(max(g, default=None), "+.1f", "%")])
    header = ["dataset", "system", "configs", "P5", "P50", "mean", "P95", "max"]
    return fig, md_table(header, body)


def ttft(rows: list[Row], options: Mapping[str, Any], records: Records) -> tuple[Figure, str]:
    """Fig 9: CDF over configurations of each system's P95 TTFT relative to vanilla."""
    names = datasets(rows)
    fig, axes = _panels(len(names))
    body = []
    for ax, name in zip(axes, names, strict=True):
        mine = of_dataset(rows, name)
        for v in [v for v in ordered(variant(r) for r in mine) if v != "vanilla"]:
            rel = sorted(paired(mine, v, "vanilla", ratio("ttft_p95")))
            ax.step(rel, np.arange(1, len(rel) + 1) / max(len(rel), 1), where="post", label=v)
            body.append([name, v, *_reductions(mine, v)])
        ax.set(title=name, xlabel="P95 TTFT / vanilla's", ylabel="CDF over configurations")
        ax.legend(fontsize=7)
    header = ["dataset", "system", "median P95 / vanilla", "best cut vs vanilla",
              "best cut vs vllm+", "best cut vs sglang+"]
    return fig, md_table(header, body)


def _reductions(rows: list[Row], name: str) -> list[str]:
    """Median P95 ratio to vanilla, then the largest P95 cut (% and ms) vs three baselines."""
    med = pct(paired(rows, name, "vanilla", ratio("ttft_p95")), 50)
    out = [fmt(med, ".3f")]
    for base in ("vanilla", "vllm+", "sglang+"):
        if base == name:
            out.append("-")
            continue
        cuts = [(1 - g[name]["ttft_p95"] / g[base]["ttft_p95"],
                 g[base]["ttft_p95"] - g[name]["ttft_p95"])
                for g in by_config(rows).values()
                if name in g and base in g and g[base]["ttft_p95"]]
        best = max(cuts, default=None)
        out.append("-" if best is None else f"{100 * best[0]:.1f}% ({1000 * best[1]:.0f} ms)")
    return out


def line(rows: list[Row], options: Mapping[str, Any], records: Records) -> tuple[Figure, str]:
    """Figs 11-13: token hit rate vs one swept parameter, with Marconi's ratios."""
    x, metric = options["x"], options.get("metric", "token_hit_rate")
    ref, bases = options.get("system", "marconi"), options.get("baselines", ["sglang+", "vllm+"])
    labels = options.get("labels", {})
    names, variants = datasets(rows), ordered(variant(r) for r in rows)
    fig, axes = _panels(len(names))
    body = []
    for ax, name in zip(axes, names, strict=True):
        mine = of_dataset(rows, name)
        xs = ordered(r[x] for r in mine)
        means = {v: [_mean(mine, v, x, xv, metric) for xv in xs] for v in variants}
        ticks = [str(labels.get(str(xv), xv)) for xv in xs]
        for v in [v for v in variants if any(m is not None for m in means[v])]:
            ax.plot(ticks, [100 * m if m is not None else np.nan for m in means[v]], "o-", label=v)
        ax.set(title=name, xlabel=options.get("xlabel", x), ylabel=f"{metric} (%)")
        ax.tick_params(axis="x", rotation=20)
        ax.legend(fontsize=7)
        for i, tick in enumerate(ticks):
            cells = [fmt(_scaled(means[v][i])) for v in variants]
            ratios = [fmt(_div(_at(means, ref, i), _at(means, b, i)), ".2f", "x") for b in bases]
            body.append([name, tick, *cells, *ratios])
    header = ["dataset", x, *[f"{v} %" for v in variants],
              *[f"{ref} / {b}" for b in bases]]
    return fig, md_table(header, body)


def _mean(rows: list[Row], name: str, x: str, value: Any, metric: str) -> float | None:
    vals = [r[metric] for r in rows if variant(r) == name and r[x] == value]
    return float(np.mean(vals)) if vals else None


def _scaled(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _at(means: dict[str, list[float | None]], name: str, i: int) -> float | None:
    return means[name][i] if name in means else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _noting_refusals(draw: FigureFn) -> FigureFn:
    """`draw`, its table followed by a note of every run that refused commits."""

    def noted(rows: list[Row], options: Mapping[str, Any], records: Records
              ) -> tuple[Figure, str]:
        fig, body = draw(rows, options, records)
        return fig, body + refusal_note(rows)

    return noted


FIGURES: dict[str, FigureFn] = {name: _noting_refusals(draw) for name, draw in {
    "hit-rate": hit_rate,
    "gain": gain,
    "ttft": ttft,
    "line": line,
    "length-bins": length_bins,
    "tuner": tuner,
    "plus-vs-peers": plus_vs_peers,
}.items()}

__all__ = ["FIGURES", "by_config"]
