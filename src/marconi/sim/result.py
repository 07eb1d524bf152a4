"""What a replay is given (`SimConfig`) and what it returns (`SimResult`), and its
summary's figures (`summarize`: a `Summary`, whose JSON is the CLI contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from marconi.core.layout import Layout
from marconi.core.serving import ServingStats, Visibility
from marconi.core.spec import ModelSpec
from marconi.core.stats import CacheStats
from marconi.core.tuning import RETUNE_WINDOW, TuningReport
from marconi.core.units import parse_size
from marconi.settings import check_all, declared, setting
from marconi.sim.analyze import taxonomy
from marconi.sim.bounds import BOUND_TOKENS
from marconi.sim.latency import DEFAULT_FLOPS_RATE, FlopsLatency, LatencyModel, ProfileLatency
from marconi.sim.metrics import hit_rate_by_length, rate
from marconi.sim.summary import (
    Bounds,
    Engine,
    Experts,
    LengthBin,
    MissTokens,
    ReuseTaxonomy,
    Served,
    Summary,
    Tuning,
)
from marconi.systems import get_system

ORACLE = "marconi-oracle"  # best static alpha in hindsight: sim.oracle, not a cache policy
OFFLINE = "offline"  # knows the trace's future: sim.offline, not a registered system
# judicious admission, eviction told which entries are reused: sim.offline, not registered
REUSE_ORACLE = "reuse-oracle"
REFERENCES = (ORACLE, OFFLINE, REUSE_ORACLE)  # names the simulator handles itself
# Requests marconi+'s shadows see in full before they sample a long stream (by session, at
# a share of the capacity); every trace of experiments/ is shorter.
SHADOW_SAMPLE_AFTER = 20_000
VISIBILITIES = tuple(v.value for v in Visibility)  # the serving replay's visibility rules


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One replay: the model, capacity and system, and the replay's settings.

    The fields after `latency` are run settings (`marconi.settings`): each has a flag of
    its name on `simulate` and `compare`, and is a sweep axis and an API keyword. A
    replay from the front ends is built by `sim.config.configure`.
    """

    spec: ModelSpec  # the model whose costs are simulated
    capacity: int | str  # bytes for KV + SSM states: 2GB, 2GiB or an integer
    system: str  # a registered system name
    alpha: float | None = None  # fixes alpha; None: the system's default (bootstrap if tuned)
    latency: LatencyModel | None = None  # TTFT model; None: from flops_rate, latency_profile
    multiplier: int = setting(
        5, "bootstrap window = this x requests before the first eviction (5..15)", minimum=1)
    objective: str = setting("flops", "what the bootstrap tuner maximizes",
                             choices=("flops", "tokens"))
    retune: bool = setting(
        True, "marconi's bootstrap tuner tunes alpha again on each following window, to the "
        "end of the trace, each window at most --retune-window requests, guarded by an "
        "alpha-0 twin",
        off="marconi's bootstrap tuner tunes alpha once, on its first window of multiplier "
        "x n0 requests (the paper's tuner), not again on each following one")
    retune_window: int | None = setting(
        None, "with retune: requests a window of marconi's bootstrap tuner holds at most "
        "(each is multiplier x n0, n0 the requests before the first eviction, capped here; "
        f"default {RETUNE_WINDOW})", positive=True, metavar="N")
    bounds: bool = setting(
        True, "also replay the infinite caches for the bounds and the miss attribution",
        off="skip the infinite caches' replay: no bounds and no miss attribution (faster)")
    bounds_tokens: int = setting(
        BOUND_TOKENS, "distinct tokens the bounds may hold; past it they are dropped, with "
        "a warning, so that memory stays bounded on huge traces", minimum=0, metavar="N")
    shadow_sample_after: int | None = setting(
        SHADOW_SAMPLE_AFTER, "marconi+: after N requests its shadow experts see a sampled "
        "eighth of the sessions at an eighth of the capacity, where sessions average two "
        "requests or more (said on stderr); none: every request, exact but up to 3x slower "
        "on long traces", minimum=0, metavar="N|none")
    page_size: int | None = setting(
        None, "tokens per KV page, KV held in whole pages (default: the system's engine "
        "layout, else 1: bytes per token)", minimum=1)
    state_slots: int | None = setting(
        None, "SSM states in a pool of their own carved out of the capacity (0: states "
        "share the byte budget; default: the system's engine layout)", minimum=0)
    replay: str = setting(
        "serving", "how the trace is replayed: serving (as a server runs it: requests "
        "overlap in a bounded batch, running requests hold memory, lookups at scheduling, "
        "closed-loop sessions) or sequential (each request committed before the next is "
        "looked up: the paper's protocol)", choices=("serving", "sequential"))
    max_running: int = setting(
        256, "serving: requests running at once, the rest wait (vLLM's --max-num-seqs)",
        positive=True)
    chunk_tokens: int | None = setting(
        None, "serving: tokens one step prefills and decodes (vLLM's "
        "--max-num-batched-tokens; default: the system's engine's, else 8192)",
        positive=True)
    visibility: str | None = setting(
        None, "serving: when what a running request computed becomes visible to the others: "
        "finish (committed whole at its finish), chunk (its input so far after each prefill "
        "chunk but the last, as SGLang) or block (after every prefill step, as vLLM's blocks "
        "fill); default: the system's engine's rule", choices=VISIBILITIES)
    hold_running: bool = setting(
        True, "serving: running requests hold their KV and a working state in the cache's "
        "capacity",
        off="serving: running requests hold nothing in the cache's capacity, as in the "
        "sequential replay")
    concurrent: bool = setting(
        False, "sequential only: requests overlap as they arrive, with no batch limit and no "
        "memory for running requests; a request's states enter when it finishes (arrival + "
        "TTFT + decode)")
    decode_s_per_token: float = setting(
        0.02, "decode seconds per output token (the concurrent replay)", minimum=0)
    flops_rate: float = setting(DEFAULT_FLOPS_RATE, "achieved prefill FLOP/s of the TTFT model",
                                positive=True)
    latency_profile: str | None = setting(
        None, "a measured TTFT profile CSV (engine-bench writes one), instead of FLOPs at "
        "flops_rate", metavar="CSV")

    # the memory layout the replayed cache runs, resolved once from the settings above
    layout: Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_all(self, REPLAY_SETTINGS)
        if self.visibility is not None and self.replay != "serving":
            raise ValueError(f"visibility: {self.visibility!r} is a rule of the serving "
                             "replay; the sequential one commits each request whole before "
                             "the next is looked up (drop --visibility or use --replay "
                             "serving)")
        if self.retune_window is not None and not self.retune:
            raise ValueError(f"retune_window: {self.retune_window} caps the windows of a "
                             "re-tuning tuner; with --no-retune the tuner tunes once, on "
                             "multiplier x n0 requests (drop one of the two)")
        if self.concurrent and self.replay == "serving":
            raise ValueError("concurrent: the earlier overlap replay runs with replay="
                             "sequential only (--replay sequential --concurrent); the serving "
                             "replay already overlaps requests, as a server does")
        object.__setattr__(self, "layout", _layout(self))  # frozen: set once, here
        self.layout.kv_capacity(self.spec, parse_size(self.capacity))  # fits the capacity
        if self.latency_profile is not None:
            self.latency_model()  # the profile is read, and checked, before a replay starts

    def settings(self) -> dict[str, Any]:
        """The run settings in force, by name (what a tuner is given to pick its own)."""
        return {s.name: getattr(self, s.name) for s in REPLAY_SETTINGS}

    def latency_model(self) -> LatencyModel:
        """The TTFT model: `latency` when given, else the profile, else FLOPs at the rate."""
        if self.latency is not None:
            return self.latency
        if self.latency_profile is not None:
            return ProfileLatency(self.latency_profile, self.spec)
        return FlopsLatency(self.spec, self.flops_rate)



def _layout(config: SimConfig) -> Layout:
    """The memory layout `config`'s cache runs: its system's (`System.layout`), the
    references' as given, else the single byte budget."""
    if config.system not in REFERENCES:
        return get_system(config.system).layout(config.spec, config.capacity,
                                                page_size=config.page_size,
                                                state_slots=config.state_slots)
    return Layout(page_size=1 if config.page_size is None else config.page_size,
                  state_slots=0 if config.state_slots is None else config.state_slots)


REPLAY_SETTINGS = declared(SimConfig)  # how a trace is replayed, as run settings


@dataclass(slots=True)
class Records:
    """One row per request, one int64 column per field."""

    n_input: np.ndarray  # input tokens
    n_output: np.ndarray  # output tokens
    hit: np.ndarray  # input tokens served from the cache
    seen: np.ndarray  # longest prefix ever seen before (the infinite-cache bound)
    from_inputs: np.ndarray  # of which seen as some earlier input (not only an output)
    bound: np.ndarray  # hit of the same system with unbounded capacity
    kv_bytes: np.ndarray  # KV bytes held after the request
    ssm_bytes: np.ndarray  # SSM state bytes held after the request

    @classmethod
    def zeros(cls, n: int) -> Records:
        return cls(**{f.name: np.zeros(n, dtype=np.int64) for f in fields(cls)})

    def __len__(self) -> int:
        return len(self.n_input)

    def resized(self, n: int) -> Records:
        """The first `n` rows, zeros after the current ones (a replay of a stream grows
        its records by doubling, then keeps the rows it filled)."""
        return Records(**{name: resized(column, n) for name, column in self.columns().items()})

    def columns(self) -> dict[str, np.ndarray]:
        """Every column by name, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def resized(column: np.ndarray, n: int) -> np.ndarray:
    """`column` cut or padded with zeros to `n` rows (a copy)."""
    out = np.zeros(n, dtype=column.dtype)
    keep = min(n, len(column))
    out[:keep] = column[:keep]
    return out


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    trace: str
    records: Records
    sessions: list[str]
    arrivals: np.ndarray
    stats: CacheStats  # the cache's counters at the end of the replay
    alpha: float | None  # in force at the end; None: a tuned system that never finished
    seconds: float
    tuning: TuningReport | None = None  # what the tuner did (None: no tuner, or nothing yet)
    # requests replayed when the bounds outgrew `config.bounds_tokens` and were dropped
    bounds_dropped: int | None = None
    # a real engine's replay (marconi.engines.real): what its worker said of itself
    engine: dict[str, Any] | None = None
    # a FLOP-aware system's alpha: "fixed" (by the user), "tuned" (the tuner finished),
    # "untuned" (it never did: alpha is None); None for systems without an alpha
    alpha_status: str | None = None
    serving: ServingStats | None = None  # the serving replay's server (None: another replay)

    def summary(self) -> Summary:
        """Every figure of the run, typed; `.to_json()` is `marconi simulate --json`."""
        return summarize(self)


def summarize(result: SimResult) -> Summary:
    """Every figure of the run (`Summary.to_json()`: the JSON of `marconi simulate`)."""
    r, spec, stats = result.records, result.config.spec, result.stats
    layout = result.config.layout
    flops_saved = float(spec.flops_array(r.hit).sum())
    flops_total = float(spec.flops_array(r.n_input).sum())
    capacity = result.config.capacity
    dropped, measured = result.bounds_dropped is not None, result.config.bounds
    return Summary(
        system=result.config.system, replay=result.config.replay, trace=result.trace,
        requests=len(r.n_input),
        input_tokens=int(r.n_input.sum()), hit_tokens=int(r.hit.sum()),
        token_hit_rate=rate(r.hit.sum(), r.n_input.sum()),
        request_hit_rate=rate((r.hit > 0).sum(), len(r.hit)),
        flops_saved=flops_saved, flops_total=flops_total,
        flops_saved_rate=rate(flops_saved, flops_total),
        alpha=result.alpha, alpha_status=result.alpha_status,
        states_admitted=stats.states_admitted, states_evicted=stats.states_evicted,
        evictions=stats.evictions, commits=stats.commits,
        refused_commits=stats.refused_commits, evicted_then_refused=stats.evicted_then_refused,
        peak_bytes=stats.peak_bytes, capacity=int(capacity) if isinstance(capacity, int)
        else capacity, model=spec.name, page_size=layout.page_size,
        state_slots=layout.state_slots, seconds=result.seconds, **_ttft(result),
        kv_bytes_mean=float(r.kv_bytes.mean()) if len(r) else 0.0,
        ssm_bytes_mean=float(r.ssm_bytes.mean()) if len(r) else 0.0,
        kv_bytes_final=int(r.kv_bytes[-1]) if len(r) else None,
        ssm_bytes_final=int(r.ssm_bytes[-1]) if len(r) else None,
        bounds_dropped_at=result.bounds_dropped,
        bounds=_bounds(r) if measured and not dropped else None,
        hit_rate_by_input_length=tuple(LengthBin(**b) for b in
                                       hit_rate_by_length(r.n_input, r.hit)),
        tuning=None if result.tuning is None else Tuning.from_report(result.tuning.to_json()),
        engine=None if result.engine is None else _engine(result.engine),
        experts=_experts(result, rate(flops_saved, flops_total)), served=_served(result))


def _served(result: SimResult) -> Served | None:
    """The serving replay's server: its counters, TTFT from issue to first token."""
    s = result.serving
    if s is None:
        return None
    ttft = s.first_token - s.issued
    ttft = ttft[~np.isnan(ttft)]
    p50, p95 = (float(x) for x in np.percentile(ttft, [50, 95])) if ttft.size else (0.0, 0.0)
    return Served(waited=s.waited, max_running=s.max_running, unreserved=s.unreserved,
                  makespan_s=s.makespan, ttft_p50=p50, ttft_p95=p95)


def _experts(result: SimResult, flops_rate: float) -> Experts | None:
    """marconi+'s experts beside the run, in the unit its tuner compared them in."""
    if result.tuning is None:
        return None
    r = result.records
    live = (flops_rate if result.config.objective == "flops"
            else rate(r.hit.sum(), r.n_input.sum()))
    return Experts.from_report(result.tuning.to_json(), live)


def _engine(meta: Mapping[str, Any]) -> Engine:
    """A real engine's replay: which engine, and what its cache code cost per request."""
    requests = max(int(meta.get("requests") or 0), 1)
    micros = meta.get("micros_total")
    return Engine(name=meta.get("engine"), version=meta.get("version"),
                  seconds=meta.get("seconds"),
                  us_per_request=None if micros is None else float(micros) / requests,
                  waited=meta.get("waited"), max_running=meta.get("max_running"),
                  integration=meta.get("integration"))  # a concurrent queue; marconi's hook


def ttft_seconds(result: SimResult) -> np.ndarray:
    """Each request's TTFT under the replay's latency model."""
    model = result.config.latency_model()
    return model.ttft(result.records.n_input, result.records.hit)


def _ttft(result: SimResult) -> dict[str, Any]:
    t = ttft_seconds(result)
    if not t.size:
        return {"ttft_p5": 0.0, "ttft_p50": 0.0, "ttft_p95": 0.0, "ttft_mean": 0.0}
    p5, p50, p95 = np.percentile(t, [5, 50, 95])
    return {"ttft_p5": float(p5), "ttft_p50": float(p50), "ttft_p95": float(p95),
            "ttft_mean": float(t.mean())}


def _bounds(r: Records) -> Bounds:
    """Infinite-cache bounds and where every missed token went.

    ```
    | hit | evicted (bound - hit) | not admitted (seen - bound) | cold (n - seen) |
    0    hit                    bound                          seen              n
    ```
    """
    n, hit, seen, bound = r.n_input, r.hit, r.seen, np.maximum(r.bound, r.hit)
    total = n.sum()
    misses = MissTokens(cold=int((n - seen).sum()),
                        not_admitted=int((seen - np.maximum(bound, hit)).clip(0).sum()),
                        evicted=int((bound - hit).clip(0).sum()))
    return Bounds(bound_token_hit_rate=rate(seen.sum(), total),  # every prefix ever seen
                  system_bound_token_hit_rate=rate(bound.sum(), total),  # no capacity limit
                  miss_tokens=misses,
                  reuse_taxonomy=ReuseTaxonomy(**taxonomy(n, seen, r.from_inputs)))
