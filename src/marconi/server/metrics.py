"""Prometheus metrics of `marconi serve` (names follow vLLM's, prefixed `marconi:`).

Cache figures are copied from the engine after every request (`publish`), so a scrape
never reads a cache the worker thread is halfway through changing, and counters are
exact at request boundaries. See README "Server" for the list.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from marconi.engines.hf import Engine, Generation

PREFIX = "marconi:"
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True, slots=True)
class CacheView:
    """The prefix cache's figures at one request boundary."""

    queries: int  # prompt tokens looked up
    hits: int  # prompt tokens served from the cache
    requests: int
    hit_requests: int
    kv_bytes: int  # attention KV held by tree edges
    ssm_bytes: int  # SSM (conv + recurrent) states held
    logits_bytes: int  # next-token logits stored beside each state (within the capacity)
    capacity: int
    peak_bytes: int
    states_admitted: int
    states_evicted: int
    evictions: int
    alpha: float

    @classmethod
    def of(cls, engine: Engine) -> CacheView:
        s, cache = engine.cache.stats, engine.cache
        return cls(queries=s.input_tokens, hits=s.hit_tokens, requests=s.lookups,
                   hit_requests=s.hit_requests, kv_bytes=s.kv_bytes,
                   ssm_bytes=s.ssm_bytes - engine.store.logits_bytes,
                   logits_bytes=engine.store.logits_bytes, capacity=cache.capacity,
                   peak_bytes=s.peak_bytes, states_admitted=s.states_admitted,
                   states_evicted=s.states_evicted, evictions=s.evictions, alpha=cache.alpha)


_COUNTERS = (  # (name, CacheView field, help)
    ("prefix_cache_queries", "queries", "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hits", "hits", "Prompt tokens served from the prefix cache."),
    ("prefix_cache_requests", "requests", "Requests looked up in the prefix cache."),
    ("prefix_cache_hit_requests", "hit_requests", "Requests with at least one cached token."),
    ("cache_states_admitted", "states_admitted", "SSM states admitted into the cache."),
    ("cache_states_evicted", "states_evicted", "SSM states evicted from the cache."),
    ("cache_evictions", "evictions", "Eviction victims (leaves removed, nodes merged)."),
)
_GAUGES = (
    ("cache_kv_bytes", "kv_bytes", "Bytes of attention KV held by the prefix cache."),
    ("cache_ssm_bytes", "ssm_bytes", "Bytes of SSM (conv + recurrent) states held."),
    ("cache_logits_bytes", "logits_bytes",
     "Bytes of next-token logits stored beside the states (within the capacity)."),
    ("cache_capacity_bytes", "capacity", "Configured bound on KV + SSM state bytes."),
    ("cache_peak_bytes", "peak_bytes", "Highest KV + SSM state bytes held so far."),
    ("cache_alpha", "alpha", "Current alpha of FLOP-aware eviction (0 until tuned)."),
)


class _CacheCollector(Collector):
    def __init__(self, view: Callable[[], CacheView]) -> None:
        self._view = view

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        view = self._view()
        for name, attr, doc in _COUNTERS:
            yield CounterMetricFamily(PREFIX + name, doc, value=getattr(view, attr))
        for name, attr, doc in _GAUGES:
            yield GaugeMetricFamily(PREFIX + name, doc, value=getattr(view, attr))


class ServerMetrics:
    """One registry per server: request metrics plus the cache collector."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._view = CacheView.of(engine)
        r = self.registry
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens served.",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.",
                                         registry=r)
        self.success = Counter(PREFIX + "request_success", "Finished requests.",
                               ["finished_reason"], registry=r)
        self.rejected = Counter(PREFIX + "request_rejected",
                                "Requests refused before running (each 4xx, by reason).",
                                ["reason"], registry=r)
        self.failed = Counter(PREFIX + "request_failure", "Requests whose generation failed.",
                              ["reason"], registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued.", registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests running.", registry=r)
        r.register(_CacheCollector(self.view))

    def view(self) -> CacheView:
        with self._lock:
            return self._view

    def publish(self, engine: Engine) -> None:
        """Copy the cache's figures (called on the worker thread, between requests)."""
        view = CacheView.of(engine)
        with self._lock:
            self._view = view

    def finished(self, engine: Engine, gen: Generation, reason: str, e2e: float) -> None:
        """Account one finished request."""
        self.prompt_tokens.inc(gen.n_input)
        self.generation_tokens.inc(len(gen.output))
        self.success.labels(finished_reason=reason).inc()
        self.e2e.observe(e2e)
        self.publish(engine)

    def failure(self, engine: Engine, error: Exception) -> None:
        """Account one failed generation: `invalid` (the engine refused the request, a
        400) or `internal` (a 500)."""
        self.failed.labels(reason="invalid" if isinstance(error, ValueError) else "internal").inc()
        self.publish(engine)

    def track_queue(self, waiting: Callable[[], float], running: Callable[[], float]) -> None:
        self.waiting.set_function(waiting)
        self.running.set_function(running)

    def render(self) -> bytes:
        return generate_latest(self.registry)
