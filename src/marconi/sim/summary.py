"""A run's summary, typed (`Summary`), with its two serializations: `to_json()`, the JSON
of `marconi simulate --json` (the CLI contract: docs/architecture.md, "Metrics"), and
`to_row()` / `from_row()`, a sweep's flat CSV or Parquet row and back.

A row keeps the scalars: the per-length hit rates, the reuse taxonomy, a tuner's full
report and a real engine's info are JSON only, and read back as None. A results file
cannot tell a missing figure from a null one; `from_row` reads both, and its gaps (None,
NaN, ""), as None.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class MissTokens:
    """Where every missed input token went, against the infinite-cache bounds."""

    cold: int  # never seen before: no cache could have hit it
    not_admitted: int  # seen, but the system never kept it
    evicted: int  # kept, then evicted before it was reused


@dataclass(frozen=True, slots=True, kw_only=True)
class ReuseTaxonomy:
    """Input tokens by the paper's reuse classes (`sim.analyze.taxonomy`)."""

    purely_input: int  # reused prefix inside an earlier input
    input_and_output: int  # reused prefix including an earlier output
    none: int  # never seen before


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """The infinite-cache bounds and the miss attribution (`SimConfig.bounds`)."""

    bound_token_hit_rate: float  # every prefix ever seen
    system_bound_token_hit_rate: float  # the same system without a capacity
    miss_tokens: MissTokens
    reuse_taxonomy: ReuseTaxonomy | None  # None: read back from a row, which lacks it


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthBin:
    """Token hit rate of the requests whose input length is in [min_tokens, max_tokens)."""

    min_tokens: int
    max_tokens: int
    requests: int
    token_hit_rate: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """What a tuner reported: the fields a row keeps, and its own JSON."""

    alpha: float | None = None  # the bootstrap tuner's choice (None: none yet, or no alpha)
    window: int | None = None  # its bootstrap window, in requests
    n0: int | None = None  # the request of the first eviction, where the window began
    sampled_from: int | None = None  # marconi+'s shadows sampled from this request on
    sample_rate: float | None = None  # ... at this share of the sessions and capacity
    report: Mapping[str, Any] | None = None  # `TuningReport.to_json()`; None: from a row

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> Tuning:
        return cls(alpha=report.get("alpha"), window=report.get("window"),
                   n0=report.get("n0"), sampled_from=report.get("sampled_from"),
                   sample_rate=report.get("sample_rate"), report=report)


@dataclass(frozen=True, slots=True, kw_only=True)
class Experts:
    """marconi+'s experts beside the run (docs/architecture.md, "marconi+'s regret"): what
    each one's shadow saved, as a share of the objective's total like the run's own rate
    the expert that ran for the most requests, the best
    one, the run's regret against it and its margin to `sglang+`'s configuration (shares;
    negative: it trails), each beside the bound the switching rule claims (None: none)."""

    saved: Mapping[str, float]
    ran_most: str
    best: str
    regret: float
    bound: float | None
    sglang_margin: float | None  # None: sglang+'s configuration is not one of its experts
    sglang_bound: float | None
    sampled: bool  # the shadows were sampled: their totals are estimates

    def over(self) -> list[str]:
        """What exceeded its bound, one phrase each (none: within the claims)."""
        out = []
        if self.bound is not None and self.regret > self.bound:
            out.append(f"its regret against its best expert ({self.best}) is "
                       f"{100 * self.regret:.2f} points, above the {100 * self.bound:.2f} "
                       "its switching rule bounds")
        if self.sglang_bound is not None and self.sglang_margin is not None \
                and -self.sglang_margin > self.sglang_bound:
            out.append(f"it trails sglang+'s configuration by {-100 * self.sglang_margin:.2f}"
                       f" points, above the {100 * self.sglang_bound:.2f} its rule bounds")
        return out

    @classmethod
    def from_report(cls, report: Mapping[str, Any], live: float) -> Experts | None:
        """From a shadow tuner's JSON (`ShadowReport.to_json`) and the run's own share
        (`live`); None for any other tuner's."""
        totals, possible = report.get("totals"), report.get("possible")
        if not isinstance(totals, Mapping) or not totals or not possible:
            return None
        saved = {name: float(t) / possible for name, t in totals.items()}
        best = str(report["best"])
        sglang = report.get("sglang_expert")  # its name among the totals (None: absent)
        lru = None if sglang is None else saved[str(sglang)]
        bound, lru_bound = report.get("bound"), report.get("sglang_bound")
        return cls(saved=saved, ran_most=str(report["ran_most"]), best=best,
                   regret=saved[best] - live,
                   bound=None if bound is None else float(bound) / possible,
                   sglang_margin=None if lru is None else live - lru,
                   sglang_bound=None if lru_bound is None else float(lru_bound) / possible,
                   sampled=report.get("sampled_from") is not None)

    def to_json(self) -> dict[str, Any]:
        return {"saved": dict(self.saved), "ran_most": self.ran_most, "best": self.best,
                "regret": self.regret, "bound": self.bound,
                "sglang_margin": self.sglang_margin, "sglang_bound": self.sglang_bound,
                "sampled": self.sampled}


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """A real engine's replay (marconi.engines.real): which engine, what its cache cost."""

    name: str | None
    version: str | None
    seconds: float | None
    us_per_request: float | None = None  # its cache code per request (None: not timed)
    waited: int | None = None  # requests that queued (a concurrent replay)
    max_running: int | None = None  # most requests running at once (a concurrent replay)
    integration: Mapping[str, Any] | None = None  # marconi's eviction hook's report

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "version": self.version,
                               "seconds": self.seconds}
        for key in ("us_per_request", "waited", "max_running", "integration"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What the serving replay's server did (`marconi.core.serving`): requests that waited
    to be scheduled, the most running at once, requests too large to hold their memory
    beside the cache (they ran without it), the time the last finished, and TTFT from
    issue to first token (queueing included)."""

    waited: int
    max_running: int
    unreserved: int
    makespan_s: float
    ttft_p50: float
    ttft_p95: float

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _SERVED}


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Every figure of one run, in the order of `marconi simulate --json`."""

    system: str
    replay: str | None  # "serving" or "sequential" (None: a row written before replays were named)
    trace: str
    requests: int
    input_tokens: int
    hit_tokens: int
    token_hit_rate: float
    request_hit_rate: float
    flops_saved: float
    flops_total: float
    flops_saved_rate: float
    alpha: float | None  # in force at the end; None: no alpha, or a tuner that never finished
    alpha_status: str | None  # "fixed", "tuned", "untuned"; None: a system without an alpha
    states_admitted: int
    states_evicted: int
    evictions: int
    commits: int | None  # None: a results file written before commits were counted
    refused_commits: int  # commits bypassed: too big for the capacity beside what is pinned
    evicted_then_refused: int | None  # evicted, then refused anyway (None: as `commits`)
    peak_bytes: int
    capacity: int | str  # bytes, or as a sweep's cell gave it ("2GB")
    model: str
    page_size: int | None  # the layout's (None: read from a row: its system's layout)
    state_slots: int | None  # as `page_size`
    seconds: float  # the replay's wall time
    ttft_p5: float
    ttft_p50: float
    ttft_p95: float
    ttft_mean: float
    kv_bytes_mean: float
    ssm_bytes_mean: float
    kv_bytes_final: int | None  # None: no requests
    ssm_bytes_final: int | None
    bounds_dropped_at: int | None  # requests replayed when the bounds outgrew their budget
    bounds: Bounds | None  # None: dropped, or not asked for
    hit_rate_by_input_length: tuple[LengthBin, ...] | None  # None: read back from a row
    tuning: Tuning | None  # None: no tuner, or nothing yet
    engine: Engine | None  # None: not a real engine's replay, or read back from a row
    experts: Experts | None = None  # marconi+'s experts and regret (None: another system)
    served: Served | None = None  # the serving replay's server (None: another replay)

    def to_json(self) -> dict[str, Any]:
        """The JSON of `marconi simulate --json`: the contract's keys first, then extras."""
        out = {key: getattr(self, key) for key in _HEAD} | self._optional_scalars()
        if self.bounds is not None and self.bounds_dropped_at is None:
            out["miss_tokens"] = _fields(self.bounds.miss_tokens, _MISSES)
            if self.bounds.reuse_taxonomy is not None:
                out["reuse_taxonomy"] = _fields(self.bounds.reuse_taxonomy, _TAXONOMY)
        if self.hit_rate_by_input_length is not None:
            out["hit_rate_by_input_length"] = [_fields(b, _BIN)
                                               for b in self.hit_rate_by_input_length]
        if self.tuning is not None:
            out["tuning"] = dict(self.tuning.report if self.tuning.report is not None
                                 else _fields(self.tuning, _TUNING))
        if self.engine is not None:
            out["engine"] = self.engine.to_json()
        if self.experts is not None:
            out["experts"] = self.experts.to_json()
        if self.served is not None:
            out["served"] = self.served.to_json()
        return out

    def to_row(self) -> dict[str, Any]:
        """A sweep's row: the scalars, `miss_tokens` and the tuner's figures flattened,
        without the columns a sweep's cell already has (system, trace, capacity, model,
        and the layout, which is its system's: docs/peers.md)."""
        out = {key: getattr(self, key) for key in _HEAD if key not in _CELL}
        out |= self._optional_scalars()
        if self.bounds is not None and self.bounds_dropped_at is None:
            out |= {f"miss_{key}": getattr(self.bounds.miss_tokens, key) for key in _MISSES}
        if self.tuning is not None:
            out |= {"tuned_alpha": self.tuning.alpha, "tuning_window": self.tuning.window,
                    "tuning_n0": self.tuning.n0}
            if self.tuning.sampled_from is not None:  # marconi+'s shadows, a long replay
                out |= {"shadows_sampled_from": self.tuning.sampled_from,
                        "shadows_sample_rate": self.tuning.sample_rate}
        if self.experts is not None:  # each expert's share as JSON text: one column
            out |= {"experts_saved": json.dumps(dict(self.experts.saved))}
            out |= {f"experts_{key}": getattr(self.experts, key) for key in _EXPERTS}
        if self.served is not None:
            out |= {f"served_{key}": getattr(self.served, key) for key in _SERVED}
        return {key: _plain(value) for key, value in out.items()}

    def _optional_scalars(self) -> dict[str, Any]:
        """The scalars after the head that a run may lack, as both serializations hold
        them: the final memory (no requests: none), the bounds' rates or where they were
        dropped (not measured: neither)."""
        out: dict[str, Any] = {}
        if self.kv_bytes_final is not None:
            out |= {"kv_bytes_final": self.kv_bytes_final,
                    "ssm_bytes_final": self.ssm_bytes_final}
        if self.bounds_dropped_at is not None:
            out["bounds_dropped_at"] = self.bounds_dropped_at
        elif self.bounds is not None:
            out |= {"bound_token_hit_rate": self.bounds.bound_token_hit_rate,
                    "system_bound_token_hit_rate": self.bounds.system_bound_token_hit_rate}
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Summary:
        """A finished row read back (a sweep's cell columns and `to_row()`'s). Raises
        ValueError when a figure every row has is missing."""
        head: dict[str, Any] = {key: _need(row, key, kind) for key, kind in _HEAD_KINDS.items()}
        head |= {key: _maybe(row, key, kind) for key, kind in _MAYBE_KINDS.items()}
        return cls(**head, capacity=_need(row, "capacity", _capacity), page_size=None,
                   state_slots=None, kv_bytes_final=_maybe(row, "kv_bytes_final", int),
                   ssm_bytes_final=_maybe(row, "ssm_bytes_final", int),
                   bounds_dropped_at=_maybe(row, "bounds_dropped_at", int),
                   bounds=_bounds_from_row(row), hit_rate_by_input_length=None,
                   tuning=_tuning_from_row(row), engine=None, experts=_experts_from_row(row),
                   served=_served_from_row(row))


def _maybe(row: Mapping[str, Any], key: str, kind: Callable[[Any], T]) -> T | None:
    """`row[key]` as `kind`; None for a gap."""
    value = gap_to_none(row.get(key))
    return None if value is None else kind(value)


def _need(row: Mapping[str, Any], key: str, kind: Callable[[Any], T]) -> T:
    """`row[key]` as `kind`; ValueError for a gap."""
    value = _maybe(row, key, kind)
    if value is None:
        raise ValueError(f"results row lacks {key!r}: {dict(row)!r:.200}")
    return value


def gap_to_none(value: Any) -> Any:
    """A results file's gap (None, NaN, "") as None; any other value as it is."""
    if value is None or (isinstance(value, str) and value == ""):
        return None
    if isinstance(value, float | np.floating) and value != value:  # NaN
        return None
    return value


def _served_from_row(row: Mapping[str, Any]) -> Served | None:
    if gap_to_none(row.get("served_waited")) is None:
        return None
    return Served(waited=_need(row, "served_waited", int),
                  max_running=_need(row, "served_max_running", int),
                  unreserved=_need(row, "served_unreserved", int),
                  makespan_s=_need(row, "served_makespan_s", float),
                  ttft_p50=_need(row, "served_ttft_p50", float),
                  ttft_p95=_need(row, "served_ttft_p95", float))


def _bounds_from_row(row: Mapping[str, Any]) -> Bounds | None:
    if gap_to_none(row.get("bound_token_hit_rate")) is None:
        return None
    misses = MissTokens(cold=_need(row, "miss_cold", int),
                        not_admitted=_need(row, "miss_not_admitted", int),
                        evicted=_need(row, "miss_evicted", int))
    return Bounds(bound_token_hit_rate=_need(row, "bound_token_hit_rate", float),
                  system_bound_token_hit_rate=_need(row, "system_bound_token_hit_rate", float),
                  miss_tokens=misses, reuse_taxonomy=None)


_EXPERTS = ("ran_most", "best", "regret", "bound", "sglang_margin", "sglang_bound", "sampled")


def _experts_from_row(row: Mapping[str, Any]) -> Experts | None:
    """marconi+'s experts and regret read back."""
    if _maybe(row, "experts_regret", float) is None:
        return None
    sampled = row.get("experts_sampled")
    saved = json.loads(_maybe(row, "experts_saved", str) or "{}")
    return Experts(saved=saved, ran_most=str(row["experts_ran_most"]),
                   best=str(row["experts_best"]), regret=float(row["experts_regret"]),
                   bound=_maybe(row, "experts_bound", float),
                   sglang_margin=_maybe(row, "experts_sglang_margin", float),
                   sglang_bound=_maybe(row, "experts_sglang_bound", float),
                   sampled=sampled in (True, "True", "true", 1, "1"))


def _tuning_from_row(row: Mapping[str, Any]) -> Tuning | None:
    tuning = Tuning(alpha=_maybe(row, "tuned_alpha", float),
                    window=_maybe(row, "tuning_window", int), n0=_maybe(row, "tuning_n0", int),
                    sampled_from=_maybe(row, "shadows_sampled_from", int),
                    sample_rate=_maybe(row, "shadows_sample_rate", float))
    return None if tuning == Tuning() else tuning


def _capacity(value: Any) -> int | str:
    """A cell's capacity as its results file stores it: text ("2GB"), or bytes."""
    return value if isinstance(value, str) else int(value)


def _fields(value: object, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: getattr(value, key) for key in keys}


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value a results file stores."""
    return value.item() if isinstance(value, np.generic) else value


# the contract's keys and the scalars always present, in order, and their kinds in a row
_HEAD_KINDS: dict[str, Callable[[Any], Any]] = {
    "system": str, "trace": str, "requests": int, "input_tokens": int, "hit_tokens": int,
    "token_hit_rate": float, "request_hit_rate": float, "flops_saved": float,
    "flops_total": float, "flops_saved_rate": float, "states_admitted": int,
    "states_evicted": int, "evictions": int, "refused_commits": int, "peak_bytes": int,
    "model": str, "seconds": float, "ttft_p5": float, "ttft_p50": float, "ttft_p95": float,
    "ttft_mean": float, "kv_bytes_mean": float, "ssm_bytes_mean": float}
_MAYBE_KINDS: dict[str, Callable[[Any], Any]] = {
    "alpha": float, "alpha_status": str, "commits": int, "evicted_then_refused": int,
    "replay": str}
_HEAD = ("system", "replay", "trace", "requests", "input_tokens", "hit_tokens", "token_hit_rate",
         "request_hit_rate", "flops_saved", "flops_total", "flops_saved_rate", "alpha",
         "alpha_status", "states_admitted", "states_evicted", "evictions", "commits",
         "refused_commits", "evicted_then_refused", "peak_bytes", "capacity", "model",
         "page_size", "state_slots", "seconds", "ttft_p5", "ttft_p50", "ttft_p95", "ttft_mean",
         "kv_bytes_mean", "ssm_bytes_mean")
_CELL = frozenset({"system", "replay", "trace", "capacity", "model", "page_size",
                   "state_slots"})
_SERVED = ("waited", "max_running", "unreserved", "makespan_s", "ttft_p50", "ttft_p95")
_MISSES = ("cold", "not_admitted", "evicted")
_TAXONOMY = ("purely_input", "input_and_output", "none")
_BIN = ("min_tokens", "max_tokens", "requests", "token_hit_rate")
_TUNING = ("alpha", "window", "n0", "sampled_from", "sample_rate")
