"""The replay loop, written once: lookup -> (prefill) -> commit, for every request.

```python
result = simulate(trace, SimConfig(spec=PAPER_7B, capacity=2e9, system="marconi"))
result.summary()      # the JSON of `marconi simulate --json` (DESIGN section 8)
```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from marconi.cache import PrefixCache
from marconi.policies import System, get_system
from marconi.sim.bounds import SeenTree
from marconi.sim.concurrent import replay_concurrent
from marconi.sim.latency import LatencyModel
from marconi.sim.metrics import summarize
from marconi.spec import ModelSpec
from marconi.tuner import BootstrapTuner
from marconi.units import parse_size
from marconi.workload.types import Request, Trace

ORACLE = "marconi-oracle"  # best static alpha in hindsight: sim.oracle, not a cache policy
OFFLINE = "offline"  # knows the trace's future: sim.offline, not a registered system
REFERENCES = (ORACLE, OFFLINE)  # names the simulator handles itself
RECORD_FIELDS = ("n_input", "n_output", "hit", "seen", "from_inputs", "bound", "kv_bytes",
                 "ssm_bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    spec: ModelSpec  # the model whose costs are simulated
    capacity: int | str  # bytes for KV + SSM states: 2GB, 2GiB or an integer
    system: str  # a registered system name
    alpha: float | None = None  # fixes alpha; None: the system's default (bootstrap if tuned)
    multiplier: int = 5  # bootstrap window = multiplier x requests before the first eviction
    objective: str = "flops"  # what the tuner maximizes: flops or tokens
    latency: LatencyModel | None = None  # TTFT model; None: FLOPs at the default rate
    bounds: bool = True  # also replay the infinite caches for bounds and miss attribution
    concurrent: bool = False  # states enter when a request finishes (arrival + TTFT + decode)
    decode_s_per_token: float = 0.02  # decode time per output token (concurrent replay)

    def __post_init__(self) -> None:
        if self.system not in REFERENCES:
            get_system(self.system)
        parse_size(self.capacity)
        if not self.decode_s_per_token >= 0:
            raise ValueError(f"decode_s_per_token must be >= 0, got {self.decode_s_per_token!r}")


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    trace: str
    records: dict[str, np.ndarray]  # one entry per request, fields RECORD_FIELDS
    sessions: list[str]
    arrivals: np.ndarray
    stats: dict[str, int]
    alpha: float
    seconds: float
    tuning: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return summarize(self)


def simulate(trace: Trace, config: SimConfig, *, progress: bool = False,
             system: System | None = None, before: Callable[[int], None] | None = None
             ) -> SimResult:
    """Replay `trace` through one cache of `config.system`; deterministic.

    `system` overrides the registered one (references built per trace, e.g. `offline`);
    `before(i)` is called before request `i` is served.
    """
    system = system or get_system(config.system)
    tuner: Any = None
    if system.tuned and config.alpha is None:
        make = system.tuner or BootstrapTuner
        tuner = make(multiplier=config.multiplier, objective=config.objective)
    cache = PrefixCache(config.spec, config.capacity, system, alpha=config.alpha, tuner=tuner)
    bound = PrefixCache(config.spec, 2**62, system, alpha=config.alpha or 0.0, tuner=None)
    seen = SeenTree()
    records = {name: np.zeros(len(trace), dtype=np.int64) for name in RECORD_FIELDS}
    start = time.perf_counter()
    bar = tqdm(trace, desc=config.system, unit="req", leave=False,
               disable=None if progress else True)  # None: only on a terminal
    if config.concurrent:
        _concurrent(trace, config, cache, records, before)
    for i, request in enumerate(bar):
        if not config.concurrent:
            if before is not None:
                before(i)
            _step(request, i, cache, records)
        if config.bounds:
            _bounds(request, i, bound, seen, records)
    seconds = time.perf_counter() - start
    return SimResult(
        config=config, trace=trace.name, records=records,
        sessions=[r.session_id for r in trace], arrivals=np.array([r.arrival for r in trace]),
        stats=cache.stats.as_dict(), alpha=cache.alpha, seconds=seconds,
        tuning=_tuning(tuner))


def _concurrent(trace: Trace, config: SimConfig, cache: PrefixCache,
                records: dict[str, np.ndarray], before: Callable[[int], None] | None) -> None:
    def record(i: int, request: Request, hit: int) -> None:
        records["n_input"][i], records["n_output"][i] = request.n_input, request.n_output
        records["hit"][i] = hit
        records["kv_bytes"][i] = cache.stats.kv_bytes
        records["ssm_bytes"][i] = cache.stats.ssm_bytes

    replay_concurrent(trace, cache, config.spec, config.latency, config.decode_s_per_token,
                      record, before)


def _step(request: Request, i: int, cache: PrefixCache, records: dict[str, np.ndarray]) -> None:
    plan = cache.lookup(request.input_tokens, boundaries=request.boundaries)
    cache.commit(request.tokens(), request.n_input, boundaries=request.boundaries)
    records["n_input"][i] = request.n_input
    records["n_output"][i] = request.n_output
    records["hit"][i] = plan.hit
    records["kv_bytes"][i] = cache.stats.kv_bytes
    records["ssm_bytes"][i] = cache.stats.ssm_bytes


def _bounds(request: Request, i: int, bound: PrefixCache, seen: SeenTree,
            records: dict[str, np.ndarray]) -> None:
    """Same system with unbounded capacity, and every prefix ever seen."""
    tokens = request.tokens()
    records["bound"][i] = bound.lookup(request.input_tokens, boundaries=request.boundaries).hit
    bound.commit(tokens, request.n_input, boundaries=request.boundaries)
    found = seen.lookup(request.input_tokens)
    records["seen"][i] = found.seen
    records["from_inputs"][i] = found.from_inputs
    seen.commit(tokens, request.n_input)


def _tuning(tuner: Any) -> dict[str, Any]:
    if hasattr(tuner, "report"):  # shadow experts (marconi+)
        return tuner.report()
    if hasattr(tuner, "history"):  # a guarded re-tuner (marconi+)
        return {"retunes": [r.as_dict() for r in tuner.history]} if tuner.history else {}
    if tuner is None or tuner.result is None:
        return {}
    r = tuner.result
    return {"n0": r.n0, "window": r.window, "alpha": r.alpha if r.scores else None,
            "scores": {str(a): s for a, s in sorted(r.scores.items())}}
