"""`Cell`: every parameter of one simulator run in a sweep, and `expand` over a grid.

A cell is what identifies a run (trace, system, capacity, model, ...: its fields) and its
run settings (`settings`: every trace and replay setting, `sim.config.SETTINGS`, by
name). A grid, a TOML `[[grid]]` table and `sweep --param` name both kinds alike.

A cell's id hashes its parameters, so a rerun skips the cells already in the results
file. `ALWAYS_IN_ID` are hashed at every value; any other parameter only off its
default, so that declaring a new setting leaves every recorded id, and row, unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from marconi.core.spec import model_from
from marconi.settings import DEFAULT, RUN
from marconi.sim.capacity import check_capacity
from marconi.sim.config import SETTINGS, configure, split
from marconi.sim.result import REFERENCES, SimConfig
from marconi.systems import get_system
from marconi.workload import TraceOptions


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """Every parameter of one simulator run; `cell_id` hashes them all. Build one with
    `Cell.of(trace=..., system=..., capacity=..., sps=2.0, ...)`."""

    dataset: str = ""  # label for reports (sharegpt, swe-agent, ...); part of the id
    trace: str  # file, folder, `sharegpt` or `synthetic:NAME`, as `load_trace` takes it
    system: str  # a registered system, marconi-oracle or offline
    capacity: str  # cache bytes for KV + states: 2GB, 2GiB or an integer
    model: str = DEFAULT.model  # preset with overrides, e.g. paper-7b,ssm=28,attn=7
    format: str | None = None  # trace format; None: inferred
    max_requests: int | None = None  # then keep the first N requests (Mooncake: no sessions)
    alpha: float | None = None  # fixed alpha; None: the system's default (bootstrap)
    records: bool = False  # also return per-request records (n_input, hit, ttft)
    # every run setting by name, defaults filled in (`of` and `__post_init__` check them)
    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **params: Any) -> Cell:
        """A cell from parameters by name: fields and run settings alike."""
        own = {f.name for f in fields(cls)} - {"settings"}
        unknown = sorted(set(params) - own - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown sweep parameter(s) {unknown}; known: {sorted(NAMES)}")
        return cls(**{k: v for k, v in params.items() if k in own},
                   settings={k: v for k, v in params.items() if k in SETTINGS})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.settings) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(SETTINGS)}")
        values = {name: s.default for name, s in SETTINGS.items()}
        for name, value in self.settings.items():
            values[name] = SETTINGS[name].check(value)
        object.__setattr__(self, "settings", values)
        if self.system not in REFERENCES:
            get_system(self.system)  # ValueError naming the unknown system or option
        check_capacity(model_from(self.model), self.capacity, self.system)
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {self.max_requests!r}")
        RUN["alpha"].check(self.alpha)
        self.trace_options()

    @property
    def cell_id(self) -> str:
        """A stable 16-hex id of every parameter (field order and types do not matter)."""
        text = json.dumps(self.id_params(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def id_params(self) -> dict[str, Any]:
        """What `cell_id` hashes: `ALWAYS_IN_ID`, and every other parameter off its default
        (off its `LEGACY` value for those whose default changed since results were first
        recorded)."""
        return {k: v for k, v in self.params().items()
                if k in ALWAYS_IN_ID or v != LEGACY.get(k, DEFAULTS[k])}

    def params(self) -> dict[str, Any]:
        """Every parameter by name: the fields, then the settings."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "settings"}
        return own | dict(self.settings)

    def columns(self) -> dict[str, Any]:
        """The parameters as result columns: `alpha` becomes `alpha_fixed`, since the
        summary's `alpha` is the one the run ended with."""
        out = {"cell_id": self.cell_id, **self.params()}
        out["alpha_fixed"] = out.pop("alpha")
        return out

    def trace_options(self) -> TraceOptions:
        return TraceOptions(**split(self.settings)[0])

    def config(self) -> SimConfig:
        """The replay this cell runs."""
        return configure(model=self.model, capacity=self.capacity, system=self.system,
                         alpha=self.alpha, **split(self.settings)[1])

    def trace_key(self) -> tuple[Any, ...]:
        """What shapes the trace (not the cache): cells sharing it share one load.
        `(trace, format, max_requests, *TraceOptions items)`, hashable."""
        options = self.trace_options().key()
        del options["params"]  # a cell has no synthetic parameters beyond its trace name
        return (self.trace, self.format, self.max_requests, *sorted(options.items()))


NAMES = ({f.name for f in fields(Cell)} - {"settings"}) | set(SETTINGS)  # every parameter
DEFAULTS = {**{f.name: f.default for f in fields(Cell) if f.default is not MISSING},
            **{name: s.default for name, s in SETTINGS.items()}}
# Hashed at every value: the parameters of the first recorded results, whose ids hashed
# them so; a recorded row is found again only under the id it was written with.
ALWAYS_IN_ID = frozenset({
    "dataset", "trace", "system", "capacity", "model", "sessions", "max_requests", "sps",
    "response_time", "mean_gap", "seed", "tokenizer", "alpha", "multiplier", "objective",
    "records"})


# The value a setting had in every row recorded before its default changed: hashed only
# off it, so that those rows keep their ids and a row of the new default gets a new one
# (every result before the serving replay was sequential, and every marconi tuned once:
# docs/architecture.md, "Replay protocols" and "Tuner").
LEGACY = {"replay": "sequential", "retune": False}


def expand(grid: Mapping[str, Any]) -> list[Cell]:
    """Cells of the cartesian product of `grid` (a list value is an axis, else fixed)."""
    unknown = sorted(set(grid) - NAMES)
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; known: {sorted(NAMES)}")
    required = [f.name for f in fields(Cell)
                if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in grid]
    if missing:
        raise ValueError(f"sweep grid lacks required parameter(s) {missing}")
    axes = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
    return [Cell.of(**dict(zip(axes, combo, strict=True)))
            for combo in itertools.product(*axes.values())]
