"""The serving replay's loop in the compiled core (`native/serving.hpp`): the same steps,
lookups, commits, times and counters as `marconi.core.serving._Server`, for a cache the
compiled core runs whole and a server whose latency model it can evaluate (docs/
architecture.md, "Replay protocols").

`serve_compiled` returns None, having touched nothing, where it cannot take a replay: the
Python core, an admission that hands positions per request, a latency model with no
compiled form (a measured profile), tokens that are not int32 arrays. The callers then
run the Python loop, which stays the reference (tests/test_serving_native.py replays both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.core import compiled
from marconi.core.cache import PrefixCache
from marconi.core.serving import Request, Serving, ServingStats, Visibility

_VISIBILITY = {Visibility.FINISH: 0, Visibility.CHUNK: 1, Visibility.BLOCK: 2}
_I64 = ("after", "hit", "kv_bytes", "ssm_bytes", "bound", "seen", "from_inputs", "order")
_F64 = ("issued", "scheduled", "first_token", "finished")


@dataclass(frozen=True, slots=True)
class Served:
    """A serving replay run by the compiled core: per request (index order) its hit and
    the cache's KV and state bytes right after its lookup; with bounds, the unbounded
    cache's hit and the every-prefix tree's (`seen`, `from_inputs`), each at its lookup;
    `order` the requests in the order they were looked up; `dropped` the requests finished
    when the bounds outgrew their limit (None: kept to the end)."""

    hit: np.ndarray
    kv_bytes: np.ndarray
    ssm_bytes: np.ndarray
    bound: np.ndarray
    seen: np.ndarray
    from_inputs: np.ndarray
    order: np.ndarray
    stats: ServingStats
    dropped: int | None


def _compiled(cache: PrefixCache | None) -> Any:
    """The cache's native core, or None where the compiled core does not run it whole."""
    if not isinstance(cache, compiled.CompiledCache) or cache._structured:
        return None
    return cache._core


def serve_compiled(requests: Sequence[Request], cache: PrefixCache, serving: Serving, *,
                   closed_loop: bool = True, bound: PrefixCache | None = None,
                   bound_limit: int = 0) -> Served | None:
    """Serve `requests` (arrival order) through `cache` as `replay_serving` does, the loop in
    the compiled core; with `bound`, the served bounds beside it (`bound` the same system
    never evicting, `bound_limit` the distinct tokens past which both bounds are dropped).
    None where the compiled core cannot run it (module docstring)."""
    core, native = _compiled(cache), getattr(serving.latency, "native", None)
    bound_core = _compiled(bound)
    if core is None or native is None or (bound is not None and bound_core is None):
        return None
    spec, rate, overhead_s = native()
    m = len(requests)
    if m == 0:
        return None
    out: dict[str, Any] = {name: np.zeros(m, dtype=np.int64) for name in _I64}
    out.update({name: np.full(m, np.nan) for name in _F64})
    n_input = np.fromiter((r.n_input for r in requests), dtype=np.int64, count=m)
    n_output = np.fromiter((r.n_output for r in requests), dtype=np.int64, count=m)
    arrival = np.fromiter((r.arrival for r in requests), dtype=np.float64, count=m)
    session = _session_codes(requests) if closed_loop else None
    server = {"max_running": serving.max_running, "chunk_tokens": serving.chunk_tokens,
              "decode_s": float(serving.decode_s),
              "visibility": _VISIBILITY[serving.visibility], "hold": serving.hold,
              "page": cache.layout.page_size, "kv_per_token": cache.spec.kv_bytes_per_token,
              "latency_spec": compiled._sizes(spec), "rate": float(rate),
              "overhead_s": float(overhead_s), "bound_limit": int(bound_limit)}
    tokens = [r.tokens() for r in requests]
    if not compiled._native.serve_loop(core, bound_core, tokens, n_input, n_output, arrival,
                                       session, server, out):
        return None
    stats = ServingStats(waited=out["waited"], max_running=out["max_running"],
                         unreserved=out["unreserved"], makespan=out["makespan"],
                         issued=out["issued"], scheduled=out["scheduled"],
                         first_token=out["first_token"], finished=out["finished"])
    return Served(hit=out["hit"], kv_bytes=out["kv_bytes"], ssm_bytes=out["ssm_bytes"],
                  bound=out["bound"], seen=out["seen"], from_inputs=out["from_inputs"],
                  order=out["order"], stats=stats, dropped=out["dropped"])


def _session_codes(requests: Sequence[Request]) -> np.ndarray:
    """An int per session, equal for requests of one session (`dependents` compares them)."""
    codes: dict[Any, int] = {}
    return np.fromiter((codes.setdefault(r.session_id, len(codes)) for r in requests),
                       dtype=np.int64, count=len(requests))
