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
Relative trace paths are relative to the config file; `{data}/...` is relative to the
data folder (`marconi reproduce --data DIR`). A grid whose trace is missing, and systems
not registered in this build, are skipped with a warning. The paper's configs ship inside
the package (`CONFIGS`), so `marconi reproduce` runs from any folder.

Instead of grids, `across = ["sglang+", "marconi+", "offline"]` runs those systems on
every configuration (workload, model, capacity) of the other experiments' cells: a
cell another figure already runs is the same cell (same id), so it runs once.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from marconi.sim.result import REFERENCES
from marconi.sim.sweep import Cell, expand
from marconi.systems import get_system

_NAMED_TRACES = ("sharegpt",)
DATA = "{data}"  # a trace path starting with it is under the data folder


class NoData(str):
    """The warning of a grid skipped because its trace is under the data folder and none
    was given; `reproduce` says these once per trace, naming the experiments."""

    experiment: str
    trace: str  # as the config writes it, `{data}/...`

    def __new__(cls, experiment: str, trace: str) -> NoData:
        where = trace.replace(DATA + "/", "")
        self = super().__new__(cls, f"{experiment}: its grid over {where} needs the data "
                                    "folder (--data DIR or $MARCONI_DATA); grid skipped")
        self.experiment, self.trace = experiment, where
        return self
CONFIGS = Path(str(resources.files("marconi.reproduction") / "configs"))  # the paper's


@dataclass(frozen=True, slots=True, kw_only=True)
class Experiment:
    """One figure to reproduce: the grids to sweep and how to draw them."""

    name: str  # output file stem (the config's stem, e.g. fig07_hit_rate)
    title: str  # figure title and table heading
    figure: str  # which figure function draws it (report.figures.FIGURES)
    paper: str = ""  # the published numbers, quoted beside ours
    options: Mapping[str, Any] = field(default_factory=dict)  # figure arguments
    grids: tuple[Mapping[str, Any], ...] = ()  # sweep grids; `quick` sub-tables inside
    across: tuple[str, ...] = ()  # systems to run on every other experiment's configurations
    source: Path | None = None  # the config file (relative trace paths start there)
    data: Path | None = None  # where `{data}/...` trace paths start; None: such grids skip

    def __post_init__(self) -> None:
        from marconi.report.figures import FIGURES

        if self.figure not in FIGURES:
            raise ValueError(f"{self.name}: unknown figure {self.figure!r}; known: "
                             f"{sorted(FIGURES)}")
        if not self.grids and not self.across:
            raise ValueError(f"{self.name}: no [[grid]] tables and no `across` systems")

    def cells(self, *, quick: bool = False,
              others: Iterable[Cell] = ()) -> tuple[list[Cell], list[str]]:
        """The cells to run, and warnings about what was skipped.

        `others`: the other experiments' cells, whose configurations `across` covers.
        """
        cells: list[Cell] = []
        warnings: list[str] = []
        for grid in self.grids:
            resolved = self._resolve(grid, quick, warnings)
            if resolved is not None:
                cells += expand(resolved)
        if self.across:
            cells += _across(self._known(list(self.across), warnings), others)
        return cells, warnings

    def _resolve(self, grid: Mapping[str, Any], quick: bool,
                 warnings: list[str]) -> dict[str, Any] | None:
        out = {k: v for k, v in grid.items() if k != "quick"}
        if quick:
            out |= dict(grid.get("quick", {}))
        # the paper's figures are reproduced under its own protocol and with its own tuner
        # (tuned once) unless a grid says
        out.setdefault("replay", "sequential")
        out.setdefault("retune", False)
        traces = [self._trace_path(t) for t in _as_list(out["trace"])]
        missing = [t for t in traces if t is None]
        if missing or not traces:
            if self.data is None and DATA in str(out["trace"]):
                warnings.append(NoData(self.name, str(out["trace"])))
            else:
                warnings.append(f"{self.name}: trace {out['trace']!r} not found; grid skipped")
            return None
        out["trace"] = traces
        out["system"] = self._known(_as_list(out.get("system", [])), warnings)
        return out if out["system"] else None

    def _known(self, systems: list[str], warnings: list[str]) -> list[str]:
        known = [s for s in systems if s in REFERENCES or _registered(s)]
        if len(known) < len(systems):
            skipped = sorted(set(systems) - set(known))
            warnings.append(f"{self.name}: systems {skipped} not registered; skipped")
        return known

    def _trace_path(self, trace: str) -> str | None:
        if trace in _NAMED_TRACES or trace.startswith("synthetic:"):
            return trace
        if trace.startswith(DATA):
            if self.data is None:
                return None
            base, trace = self.data, trace[len(DATA):].lstrip("/")
        else:
            base = self.source.parent if self.source is not None else Path.cwd()
        path = (base / trace).resolve()
        return str(path) if path.exists() else None


def _across(systems: list[str], others: Iterable[Cell]) -> list[Cell]:
    """Each system on each distinct configuration of `others`, at default cache settings
    (bootstrap alpha, m = 5, no records), so cells the figures share keep their ids."""
    out: dict[str, Cell] = {}
    for cell in others:
        for system in systems:
            settings = {**cell.settings, "multiplier": 5, "objective": "flops"}
            new = dataclasses.replace(cell, system=system, alpha=None, records=False,
                                      settings=settings)
            out.setdefault(new.cell_id, new)
    return list(out.values())


def plan(experiments: list[Experiment], *,
         quick: bool = False) -> dict[str, tuple[list[Cell], list[str]]]:
    """Each experiment's cells and warnings; `across` experiments cover the others'."""
    out = {e.name: e.cells(quick=quick) for e in experiments if not e.across}
    others = [cell for cells, _ in out.values() for cell in cells]
    out |= {e.name: e.cells(quick=quick, others=others) for e in experiments if e.across}
    return {e.name: out[e.name] for e in experiments}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def load_experiment(path: str | Path, data: Path | None = None) -> Experiment:
    path = Path(path)
    with path.open("rb") as f:
        content = tomllib.load(f)
    known = {"title", "figure", "paper", "options", "grid", "across"}
    unknown = sorted(set(content) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    return Experiment(name=path.stem, title=content.get("title", path.stem),
                      figure=content.get("figure", ""), paper=content.get("paper", ""),
                      options=content.get("options", {}), grids=tuple(content.get("grid", [])),
                      across=tuple(content.get("across", ())), source=path, data=data)


def load_experiments(paths: list[Path], only: list[str] | None = None, *,
                     data: Path | None = None) -> list[Experiment]:
    """Every `*.toml` under the given files/folders, sorted by name; `only` filters by
    prefix; `data` is where `{data}/...` traces start."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.toml")) if path.is_dir() else [path]
    experiments = [load_experiment(f, data) for f in files]
    if only:
        experiments = [e for e in experiments if any(e.name.startswith(o) for o in only)]
    if not experiments:
        raise ValueError(f"no experiment configs found in {[str(p) for p in paths]}")
    return experiments


def _registered(name: str) -> bool:
    """Whether `name` is a registered system (options included)."""
    try:
        get_system(name)
    except ValueError:
        return False
    return True
