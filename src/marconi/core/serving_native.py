"""The serving replay's loop in the compiled core (`native/serving.hpp`): the same steps,
lookups, commits, times and counters as `marconi.core.serving._Server`, for a cache on the
compiled core and a server whose latency model it can evaluate (docs/
architecture.md, "Replay protocols").

`serve_compiled` returns None, having touched nothing, where it cannot take a replay: the
Python core, a latency model with no compiled form (a measured profile), tokens that are
not int32 arrays. The callers then run the Python loop, which stays the reference
(tests/test_serving_native.py replays both). What must see each request as it is served
(a record, a tuner, marconi+'s shadows, a commit callback) is told by the compiled loop at
the Python loop's places, and an admission that hands the core positions per request
(marconi+'s structured admission, sparse prefix caching's) is asked for them right before
each lookup and commit, as `CompiledCache.lookup` and `commit` ask it (`Hook`);
`replay_serving` here is `core.serving.replay_serving` with the loop compiled where it can
be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from marconi.core import compiled
from marconi.core.cache import PrefixCache
from marconi.core.serving import Follower, Record, Request, Serving, ServingStats, Visibility
from marconi.core.serving import replay_serving as replay_python
from marconi.core.tuning import Tuner

# the events a hook is told of, and where a placement is asked (`native/serving.hpp`)
SCHEDULED, SHOWN, FINISHED, PLACE, PLACE_BOUND = 1, 2, 4, 8, 16
AT_LOOKUP, AT_FINISH = -1, -2

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


class Hook:
    """What the Python loop tells as it serves (`core.serving._Server`), told by the
    compiled loop at the same places: at a request's scheduling `record(i, request, hit)`
    then the follower's `scheduled`; when it makes tokens visible the follower's `shown`
    then `on_commit`; at its finish the follower's `finished`, the tuner's `observe` (with
    its issue time) and `on_commit`. Before each lookup and commit in a cache whose admission
    hands positions per request (the live one, `PLACE`; the bound, `PLACE_BOUND`), its
    positions for that call, from the tokens, input length and boundaries
    `CompiledCache.lookup` / `commit` would be given there (`place`)."""

    def __init__(self, requests: Sequence[Request], cache: PrefixCache,
                 record: Record | None = None, tuner: Tuner | None = None,
                 on_commit: Callable[[int, Any, int, bool], None] | None = None) -> None:
        self.requests, self.cache, self.record, self.tuner = requests, cache, record, tuner
        self.bound: PrefixCache | None = None  # the served bounds' cache (`serve_compiled`)
        self.on_commit = on_commit
        self.follower = cast("Follower | None",
                             tuner if hasattr(tuner, "scheduled") else None)
        self.events = ((SCHEDULED if record is not None or self.follower else 0)
                       | (SHOWN if self.follower or on_commit is not None else 0)
                       | (FINISHED if self.follower or tuner is not None
                          or on_commit is not None else 0))
        self.issued = np.zeros(0)  # each request's issue time, as the loop writes it
        self.error: BaseException | None = None  # what a callback raised

    def tell(self, kind: int, i: int, x: int) -> None:
        request = self.requests[i]
        if kind in (PLACE, PLACE_BOUND):
            self.place(kind == PLACE_BOUND, request, x)
        elif kind == SCHEDULED:
            if self.record is not None:
                self.record(i, request, x)
            if self.follower is not None:
                self.follower.scheduled(self.cache, i, request, x)
        elif kind == SHOWN:
            if self.follower is not None:
                self.follower.shown(i, request, x)
            if self.on_commit is not None:
                self.on_commit(i, request, x, False)
        else:
            if self.follower is not None:
                self.follower.finished(i, request)
            if self.tuner is not None:
                self.tuner.observe(self.cache, request.tokens(), request.n_input,
                                   request.boundaries, request.session_id,
                                   arrival=float(self.issued[i]))
            if self.on_commit is not None:
                self.on_commit(i, request, request.n_input + request.n_output, True)

    def place(self, bound: bool, request: Request, x: int) -> None:
        """Hand the live cache's (or the bound's) admission its positions for the loop's
        next call: the lookup of `request`'s input (`AT_LOOKUP`), the commit of its whole
        sequence (`AT_FINISH`; the bound's boundaries past the input left out, as
        `sim.replay._ServedBounds.commit` leaves them) or of its first x input tokens (a
        show: boundaries up to x)."""
        cache = cast("compiled.CompiledCache", self.bound if bound else self.cache)
        if x == AT_LOOKUP:
            key, n, at, phase = request.input_tokens, request.n_input, request.boundaries, "lookup"
        elif x == AT_FINISH:
            key, n, phase = request.tokens(), request.n_input, "commit"
            at = tuple(b for b in request.boundaries if b <= n) if bound else request.boundaries
        else:
            key, n, phase = request.input_tokens[:x], x, "commit"
            at = tuple(b for b in request.boundaries if b <= x)
        cache._place(cache._key(key, phase, None), n, at, phase)


def replay_serving(requests: Sequence[Request], cache: PrefixCache, serving: Serving,
                   record: Record, before: Callable[[int], None] | None = None,
                   tuner: Tuner | None = None, *, closed_loop: bool = True,
                   on_commit: Callable[[int, Any, int, bool], None] | None = None
                   ) -> ServingStats:
    """`core.serving.replay_serving`: the loop in the compiled core where it can run
    (`serve_compiled`; a `before` callback keeps the Python loop), else the Python loop;
    the same calls, in the same order, either way."""
    if before is None:
        hook = Hook(requests, cache, record, tuner, on_commit)
        served = serve_compiled(requests, cache, serving, closed_loop=closed_loop, hook=hook)
        if served is not None:
            return served.stats
    return replay_python(requests, cache, serving, record, before, tuner,
                         closed_loop=closed_loop, on_commit=on_commit)


def compiled_loop(cache: PrefixCache, serving: Serving) -> bool:
    """Whether `serve_compiled` runs a replay through `cache` (or a cache of its policies)
    under `serving` in the compiled core."""
    return _compiled(cache) is not None and hasattr(serving.latency, "native")


def _compiled(cache: PrefixCache | None) -> Any:
    """The cache's native core, or None where the compiled core does not run it."""
    if not isinstance(cache, compiled.CompiledCache):
        return None
    return cache._core


def _placed(cache: PrefixCache | None) -> bool:
    """Whether the cache's admission hands its core positions per request."""
    return isinstance(cache, compiled.CompiledCache) and cache._structured


def serve_compiled(requests: Sequence[Request], cache: PrefixCache, serving: Serving, *,
                   closed_loop: bool = True, bound: PrefixCache | None = None,
                   bound_limit: int = 0, hook: Hook | None = None) -> Served | None:
    """Serve `requests` (arrival order) through `cache` as `core.serving.replay_serving`
    does, the loop in the compiled core; with `bound`, the served bounds beside it (`bound`
    the same system never evicting, `bound_limit` the distinct tokens past which both
    bounds are dropped); `hook` told of each event (`Hook`). None where the compiled core
    cannot run it (module docstring)."""
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
    places = (PLACE if _placed(cache) else 0) | (PLACE_BOUND if _placed(bound) else 0)
    if places:
        hook = hook if hook is not None else Hook(requests, cache)
        hook.bound = bound
        hook.events |= places
    if hook is not None:
        hook.issued = out["issued"]
    if not compiled._native.serve_loop(core, bound_core, tokens, n_input, n_output, arrival,
                                       session, server, out,
                                       hook if hook is not None and hook.events else None):
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
