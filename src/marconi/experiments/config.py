"""Experiment configs: one TOML file per paper figure.

```toml
title = "Figure 7: token hit rate"
figure = "hit-rate"              # a key of marconi.report.figures.FIGURES
paper = "4.5x / 7.3x / 34.4x over vLLM+"
[options]                        # passed to the figure (x axis, baseline, ...)
[[grid]]                         # any Cell field; a list is an axis
dataset = "sharegpt"
trace = "sharegpt"
system = ["vllm+", "sglang+", "marconi"]
capacity = ["2GB", "4GB"]
[grid.quick]                     # replaces fields when --quick
capacity = "2GB"
```
Relative trace paths are relative to the config file. A grid whose trace is missing,
and systems not registered in this build, are skipped with a warning.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marconi.policies import SYSTEMS
from marconi.sim.replay import ORACLE
from marconi.sim.sweep import Cell, expand

_NAMED_TRACES = ("sharegpt",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Experiment:
    """One figure to reproduce: the grids to sweep and how to draw them."""

    name: str  # output file stem (the config's stem, e.g. fig07_hit_rate)
    title: str  # figure title and table heading
    figure: str  # which figure function draws it (report.figures.FIGURES)
    paper: str = ""  # the published numbers, quoted beside ours
    options: Mapping[str, Any] = field(default_factory=dict)  # figure arguments
    grids: tuple[Mapping[str, Any], ...] = ()  # sweep grids; `quick` sub-tables inside
    source: Path | None = None  # the config file (relative trace paths start there)

    def __post_init__(self) -> None:
        from marconi.report.figures import FIGURES

        if self.figure not in FIGURES:
            raise ValueError(f"{self.name}: unknown figure {self.figure!r}; known: "
                             f"{sorted(FIGURES)}")
        if not self.grids:
            raise ValueError(f"{self.name}: no [[grid]] tables")

    def cells(self, *, quick: bool = False) -> tuple[list[Cell], list[str]]:
        """The cells to run, and warnings about what was skipped."""
        cells: list[Cell] = []
        warnings: list[str] = []
        for grid in self.grids:
            resolved = self._resolve(grid, quick, warnings)
            if resolved is not None:
                cells += expand(resolved)
        return cells, warnings

    def _resolve(self, grid: Mapping[str, Any], quick: bool,
                 warnings: list[str]) -> dict[str, Any] | None:
        out = {k: v for k, v in grid.items() if k != "quick"}
        if quick:
            out |= dict(grid.get("quick", {}))
        traces = [self._trace_path(t) for t in _as_list(out["trace"])]
        missing = [t for t in traces if t is None]
        if missing or not traces:
            warnings.append(f"{self.name}: trace {out['trace']!r} not found; grid skipped")
            return None
        out["trace"] = traces
        systems = _as_list(out.get("system", []))
        known = [s for s in systems if s in SYSTEMS or s == ORACLE]
        if len(known) < len(systems):
            skipped = sorted(set(systems) - set(known))
            warnings.append(f"{self.name}: systems {skipped} not registered; skipped")
        out["system"] = known
        return out if known else None

    def _trace_path(self, trace: str) -> str | None:
        if trace in _NAMED_TRACES or trace.startswith("synthetic:"):
            return trace
        base = self.source.parent if self.source is not None else Path.cwd()
        path = (base / trace).resolve()
        return str(path) if path.exists() else None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    with path.open("rb") as f:
        data = tomllib.load(f)
    known = {"title", "figure", "paper", "options", "grid"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    return Experiment(name=path.stem, title=data.get("title", path.stem),
                      figure=data.get("figure", ""), paper=data.get("paper", ""),
                      options=data.get("options", {}), grids=tuple(data.get("grid", [])),
                      source=path)


def load_experiments(paths: list[Path], only: list[str] | None = None) -> list[Experiment]:
    """Every `*.toml` under the given files/folders, sorted by name; `only` filters by prefix."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.toml")) if path.is_dir() else [path]
    experiments = [load_experiment(f) for f in files]
    if only:
        experiments = [e for e in experiments if any(e.name.startswith(o) for o in only)]
    if not experiments:
        raise ValueError(f"no experiment configs found in {[str(p) for p in paths]}")
    return experiments
