"""Concurrency-aware replay: a request's states enter the cache when it finishes.

```
arrival --lookup, pin--> prefill (TTFT model) --> decode (n_output x s/token) --commit, unpin-->
```
Requests overlap: one that arrives before an earlier one finishes cannot reuse what that
one will commit, and every running request pins the path it resumes from. Finishes are
applied in time order before each arrival (ties: arrival order).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import numpy as np

from marconi.core.cache import Plan, PrefixCache
from marconi.core.spec import ModelSpec
from marconi.core.tuning import Tuner
from marconi.sim.latency import FlopsLatency, LatencyModel
from marconi.workload.types import Request

Running = tuple[float, int, Request, Plan]  # finish time, index, request, its lookup


def replay_concurrent(requests: Iterable[Request], cache: PrefixCache, spec: ModelSpec,
                      latency: LatencyModel | None, decode_s: float,
                      record: Callable[[int, Request, int], None],
                      before: Callable[[int], None] | None = None,
                      tuner: Tuner | None = None) -> None:
    """Serve `requests` (arrival order) with overlap; `record(i, request, hit)` per lookup;
    `tuner` observes each commit."""
    model = latency or FlopsLatency(spec)
    running: list[Running] = []
    for i, request in enumerate(requests):
        while running and running[0][0] <= request.arrival:
            _finish(cache, tuner, heapq.heappop(running))
        if before is not None:
            before(i)
        plan = cache.lookup(request.input_tokens, boundaries=request.boundaries,
                            salt=_salt(cache, request))
        cache.pin(plan.node)
        record(i, request, plan.hit)
        ttft = float(model.ttft(np.array([request.n_input]), np.array([plan.hit]))[0])
        heapq.heappush(running, (request.arrival + ttft + decode_s * request.n_output, i,
                                 request, plan))
    while running:
        _finish(cache, tuner, heapq.heappop(running))


def _finish(cache: PrefixCache, tuner: Tuner | None, item: Running) -> None:
    _, _, request, plan = item
    tokens = request.tokens()
    cache.commit(tokens, request.n_input, boundaries=request.boundaries,
                 salt=_salt(cache, request))
    if tuner is not None:
        tuner.observe(cache, tokens, request.n_input, request.boundaries, request.session_id)
    cache.unpin(plan.node)


def _salt(cache: PrefixCache, request: Request) -> str | None:
    """The request's session, where the system keeps a namespace per session."""
    return request.session_id if cache.admission.per_session else None
