"""Run every experiment's cells as one sweep, then draw each figure and its table.

Output folder layout:
```
OUT/sweep.csv            one row per cell, all experiments (cells shared by figures run once)
OUT/records/ID.npz       per-request records of cells that asked for them
OUT/NAME.png, NAME.md    one figure and one markdown table per experiment
OUT/SUMMARY.md           every table, with the run's settings and time
```
"""

from __future__ import annotations

import sys
import textwrap
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marconi.reproduction.config import Experiment, NoData, plan
from marconi.sim.sweep import Cell, load_records, refusal_warnings, run_sweep


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one reproduction wrote."""

    summary: Path  # OUT/SUMMARY.md
    figures: tuple[Path, ...]  # one PNG per experiment drawn
    failed_cells: int  # rows with status error (retried by the next run)
    seconds: float  # wall time of the sweep and the drawing


def reproduce(experiments: list[Experiment], out: Path, *, quick: bool = False,
              executor: Executor | None = None, workers: int | None = None,
              progress: bool = True) -> Outcome:
    """Sweep the experiments' cells into `out/sweep.csv`, then write PNGs and tables."""
    start = time.perf_counter()
    planned = plan(experiments, quick=quick)
    for warning in _grouped([w for _, warnings in planned.values() for w in warnings]):
        print(f"reproduce: {warning}", file=sys.stderr)
    cells = [cell for cells, _ in planned.values() for cell in cells]
    rows = run_sweep(cells, out / "sweep.csv", executor=executor, workers=workers,
                     progress=progress, records_dir=out / "records")
    by_id = {row["cell_id"]: row for row in rows}
    sections, figures = [], []
    for exp in experiments:
        mine = _rows(planned[exp.name][0], by_id)
        if not mine:
            continue
        png, table = draw(exp, mine, out)
        figures.append(png)
        sections.append(table)
    distinct = {row["cell_id"]: row for row in rows}  # figures may share cells
    warned = refusal_warnings(distinct.values())
    if warned:
        print(f"reproduce: {len(warned)} warning{'s' * (len(warned) != 1)} from its cells "
              "(refused commits, untuned alphas, dropped bounds; the note under each table "
              f"names the cells that refused); the first: {warned[0]}", file=sys.stderr)
    failed = sum(row["status"] != "ok" for row in distinct.values())
    seconds = time.perf_counter() - start
    cell_seconds = sum(float(row.get("wall_s") or 0) for row in distinct.values())
    summary = _write_summary(out, sections, quick=quick, cells=len(distinct), failed=failed,
                             cell_seconds=cell_seconds)
    return Outcome(summary=summary, figures=tuple(figures), failed_cells=failed,
                   seconds=seconds)


def _grouped(warnings: list[str]) -> list[str]:
    """The planning warnings, those of grids skipped for want of the data folder said once
    per trace with the experiments they skipped (`config.NoData`), the others as they
    are, each once."""
    skipped: dict[str, list[str]] = {}
    out = []
    for warning in warnings:
        if isinstance(warning, NoData):
            skipped.setdefault(warning.trace, []).append(warning.experiment)
        elif warning not in out:
            out.append(warning)
    for trace, names in skipped.items():
        names = list(dict.fromkeys(names))
        grids = sum(1 for w in warnings if isinstance(w, NoData) and w.trace == trace)
        out.append(f"no data folder (--data DIR or $MARCONI_DATA): skipped {grids} "
                   f"grid{'s' * (grids != 1)} over {trace} ({', '.join(names)})")
    return out


def _rows(cells: list[Cell], by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [by_id[c.cell_id] for c in cells
            if c.cell_id in by_id and by_id[c.cell_id]["status"] == "ok"]


def draw(exp: Experiment, rows: list[dict[str, Any]], out: Path) -> tuple[Path, str]:
    """Write OUT/NAME.png and OUT/NAME.md; return the PNG path and the markdown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from marconi.report.figures import FIGURES

    fig, body = FIGURES[exp.figure](rows, dict(exp.options),
                                    lambda cell_id: load_records(out / "records", cell_id))
    # wrapped to the figure's width: a one-panel figure is narrower than the title
    fig.suptitle(textwrap.fill(exp.title, max(30, int(fig.get_figwidth() * 11))))
    fig.tight_layout()
    png = out / f"{exp.name}.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    paper = f"\nPaper: {exp.paper}\n" if exp.paper else ""
    text = f"## {exp.title}\n{paper}\n![{exp.name}]({exp.name}.png)\n\n{body}\n"
    (out / f"{exp.name}.md").write_text(text)
    return png, text


def _write_summary(out: Path, sections: list[str], *, quick: bool, cells: int, failed: int,
                   cell_seconds: float) -> Path:
    mode = "quick (CI-sized)" if quick else "full"
    head = (f"# Reproduction: {mode} run\n\n{cells} cells ({failed} failed), "
            f"{cell_seconds:.0f} s of worker time in all (each cell's own, whenever it ran).\n")
    path = out / "SUMMARY.md"
    path.write_text("\n".join([head, *sections]))
    return path
