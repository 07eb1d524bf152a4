"""`Cell`: every parameter of one simulator run in a sweep, and `expand` over a grid.

A cell's id hashes its parameters, so a rerun skips the cells already in the results
file. Trace knobs added after results were recorded (`ADDED`) enter the hash only when
they differ from their defaults: the ids of earlier cells, and so their rows, still match.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from marconi.core.spec import resolve_model
from marconi.sim.capacity import check_capacity
from marconi.sim.result import REFERENCES, SHADOW_SAMPLE_AFTER
from marconi.systems import get_system
from marconi.workload import TraceOptions
from marconi.workload.options import DEFAULT_TOKENIZER

_DEFAULTS = TraceOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """Every parameter of one simulator run; `cell_id` hashes them all."""

    dataset: str = ""  # label for reports (sharegpt, swe-agent, ...); part of the id
    trace: str  # file, folder, `sharegpt` or `synthetic:NAME`, as `load_trace` takes it
    system: str  # a registered system, marconi-oracle or offline
    capacity: str  # cache bytes for KV + states: 2GB, 2GiB or an integer
    model: str = "paper-7b"  # preset with overrides, e.g. paper-7b,ssm=28,attn=7
    sessions: int | None = 100  # first N eligible sessions (paper: 100); None: all
    max_requests: int | None = None  # then keep the first N requests (Mooncake: no sessions)
    sps: float = 1.0  # sessions per second
    response_time: float = 0.0  # chat: model response time (s) before the user types
    mean_gap: float = 5.0  # agents: mean Poisson gap between calls (s)
    seed: int = 0  # arrivals and pseudo-random tokens
    tokenizer: str = DEFAULT_TOKENIZER  # text formats only
    alpha: float | None = None  # fixed alpha; None: the system's default (bootstrap)
    multiplier: int = 5  # bootstrap window multiplier (5..15)
    objective: str = "flops"  # what the tuner maximizes: flops or tokens
    records: bool = False  # also return per-request records (n_input, hit, ttft)
    # requests after which marconi+'s shadows are sampled by session (None: never)
    shadow_sample_after: int | None = SHADOW_SAMPLE_AFTER
    # the other trace knobs (TraceOptions, docs/architecture.md "Workloads")
    format: str | None = None  # trace format; None: inferred
    min_turns: int | None = _DEFAULTS.min_turns  # None: the format's default
    typing_wpm: float = _DEFAULTS.typing_wpm
    max_input_tokens: int | None = _DEFAULTS.max_input_tokens
    collapse_observations: int | None = _DEFAULTS.collapse_observations
    vocab_size: int = _DEFAULTS.vocab_size
    block_size: int = _DEFAULTS.block_size
    session_field: str | None = _DEFAULTS.session_field

    def __post_init__(self) -> None:
        if self.system not in REFERENCES:
            get_system(self.system)  # ValueError naming the unknown system or option
        check_capacity(resolve_model(self.model), self.capacity, self.system)
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {self.max_requests!r}")
        if self.alpha is not None and self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha!r}")
        if self.shadow_sample_after is not None and (
                isinstance(self.shadow_sample_after, bool)
                or not isinstance(self.shadow_sample_after, int)
                or self.shadow_sample_after < 0):
            raise ValueError("shadow_sample_after must be a whole number >= 0 or None, got "
                             f"{self.shadow_sample_after!r}")
        self.trace_options()

    @property
    def cell_id(self) -> str:
        """A stable 16-hex id of every parameter (field order and types do not matter)."""
        params = {k: v for k, v in self.params().items() if k not in ADDED or v != ADDED[k]}
        text = json.dumps(params, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def columns(self) -> dict[str, Any]:
        """The parameters as result columns: `alpha` becomes `alpha_fixed`, since the
        summary's `alpha` is the one the run ended with."""
        out = {"cell_id": self.cell_id, **self.params()}
        out["alpha_fixed"] = out.pop("alpha")
        return out

    def trace_options(self) -> TraceOptions:
        return TraceOptions(
            tokenizer=self.tokenizer, sessions=self.sessions, min_turns=self.min_turns,
            sessions_per_second=self.sps, typing_wpm=self.typing_wpm,
            response_time_s=self.response_time, mean_gap_s=self.mean_gap,
            max_input_tokens=self.max_input_tokens,
            collapse_observations=self.collapse_observations, seed=self.seed,
            vocab_size=self.vocab_size, block_size=self.block_size,
            session_field=self.session_field)

    def trace_key(self) -> tuple[Any, ...]:
        """What shapes the trace (not the cache): cells sharing it share one load.
        `(trace, format, max_requests, *TraceOptions items)`, hashable."""
        options = self.trace_options().key()
        del options["params"]  # a cell has no synthetic parameters beyond its trace name
        return (self.trace, self.format, self.max_requests, *sorted(options.items()))


# fields added after results were recorded, with their defaults (see the module docstring)
ADDED: dict[str, Any] = {name: Cell.__dataclass_fields__[name].default for name in (
    "format", "min_turns", "typing_wpm", "max_input_tokens", "collapse_observations",
    "vocab_size", "block_size", "session_field", "shadow_sample_after")}


def expand(grid: Mapping[str, Any]) -> list[Cell]:
    """Cells of the cartesian product of `grid` (a list value is an axis, else fixed)."""
    names = [f.name for f in fields(Cell)]
    unknown = sorted(set(grid) - set(names))
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; known: {names}")
    required = [f.name for f in fields(Cell)
                if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in grid]
    if missing:
        raise ValueError(f"sweep grid lacks required parameter(s) {missing}")
    axes = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
    return [Cell(**dict(zip(axes, combo, strict=True)))
            for combo in itertools.product(*axes.values())]
