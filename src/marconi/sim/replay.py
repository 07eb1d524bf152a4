"""The replay loop, written once: lookup -> (prefill) -> commit -> tuner, per request.

```python
result = simulate(trace, SimConfig(spec=PAPER_7B, capacity=2e9, system="marconi"))
result.summary()      # every figure, typed; .to_json(): `marconi simulate --json`
```
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from itertools import islice

import numpy as np
from tqdm import tqdm

from marconi.core.cache import PrefixCache
from marconi.core.layout import Layout
from marconi.core.tuning import Tuner
from marconi.sim.bounds import UNBOUNDED, SeenTree, keep_all
from marconi.sim.concurrent import replay_concurrent
from marconi.sim.result import Records, SimConfig, SimResult, resized
from marconi.systems import System, TunerOptions, get_system
from marconi.workload.types import Request, Trace

STREAM_ROWS = 4096  # rows a replay of a stream (no length known) starts its records with
BATCH = 1024  # requests served in one call once nothing else needs to see each one


def simulate(trace: Trace | Iterable[Request], config: SimConfig, *, progress: bool = False,
             system: System | None = None, before: Callable[[int], None] | None = None
             ) -> SimResult:
    """Replay `trace` through one cache of `config.system`; deterministic.

    `trace` may be any iterable of requests in arrival order, a stream too long to hold
    in memory (not with `config.concurrent`): records grow as it is read, by doubling.
    `system` overrides the registered one (references built per trace, e.g. `offline`);
    `before(i)` is called before request `i` is served.
    """
    if config.concurrent and not isinstance(trace, Sized):
        raise ValueError("a concurrent replay needs the whole trace, not a stream")
    trace = with_inputs(trace)
    system = system or get_system(config.system)
    # waits for its replays: a deterministic run
    tuner = system.make_tuner(config.alpha, TunerOptions(wait=True, settings=config.settings()))
    # token-only: on the compiled core where it runs the system (a concurrent replay's
    # pins too)
    cache = system.cache(config.spec, config.capacity, alpha=config.alpha,
                         layout=config.layout, as_engine=True, replay=True)
    # the same pages, no state pool: nothing is ever evicted
    bound: PrefixCache | None = system.cache(
        config.spec, UNBOUNDED, alpha=config.alpha,
        layout=Layout(page_size=config.layout.page_size), evict_with=keep_all,
        as_engine=True, replay=True) if config.bounds else None
    seen, dropped = SeenTree(), None
    records = Records.zeros(len(trace) if isinstance(trace, Sized) else STREAM_ROWS)
    arrivals, sessions = np.zeros(len(records)), []
    start = time.perf_counter()
    bar = tqdm(trace, desc=config.system, unit="req", leave=False,
               disable=None if progress else True)  # None: only on a terminal
    if config.concurrent:
        _concurrent(trace, config, cache, tuner, records, before)
    # once nothing but the cache sees each request (no tuner left to feed, no bounds, no
    # callback), requests are served in batches: the compiled core runs their loop
    batchable = not config.concurrent and before is None and not cache.admission.per_session
    requests, served = iter(bar), 0
    for i, request in enumerate(requests):
        records, arrivals = _room(records, arrivals, i + 1)
        sessions.append(request.session_id)
        arrivals[i] = request.arrival
        served = i + 1
        if not config.concurrent:
            if before is not None:
                before(i)
            _step(request, i, cache, tuner, records)
        if bound is not None:
            _bounds(request, i, bound, seen, records)
            if seen.tokens > config.bounds_tokens:  # they would grow with the trace
                bound, seen, dropped = None, SeenTree(), i + 1
        if batchable and bound is None and (
                tuner is None or bool(getattr(tuner, "done", False))):
            break
    # the rest in batches of BATCH, their loop in the compiled core
    while batch := list(islice(requests, BATCH)):
        end = served + len(batch)
        records, arrivals = _room(records, arrivals, end)
        sessions.extend([r.session_id for r in batch])
        arrivals[served:end] = [r.arrival for r in batch]
        _serve_batch(batch, served, cache, records)
        served = end
    if len(sessions) < len(records):  # the stream's rows only
        records, arrivals = records.resized(len(sessions)), resized(arrivals, len(sessions))
    seconds = time.perf_counter() - start
    alpha, status = alpha_in_force(system, config, tuner, cache.alpha)
    return SimResult(
        config=config, trace=trace.name if isinstance(trace, Trace) else "stream", records=records,
        sessions=sessions, arrivals=arrivals, stats=cache.stats.copy(), alpha=alpha,
        seconds=seconds, tuning=tuner.report() if tuner is not None else None,
        bounds_dropped=dropped, alpha_status=status)


def _room(records: Records, arrivals: np.ndarray, rows: int) -> tuple[Records, np.ndarray]:
    """Records (and arrivals) with room for `rows`: a stream outgrowing them doubles them,
    or more where a batch needs more."""
    if rows <= len(records):
        return records, arrivals
    grown = max(2 * len(records), rows)
    return records.resized(grown), resized(arrivals, grown)


def _record(records: Records, i: int, request: Request, hit: int, cache: PrefixCache) -> None:
    """Row `i`: `request`'s lengths, its hit, the cache's bytes after it."""
    records.n_input[i] = request.n_input
    records.n_output[i] = request.n_output
    records.hit[i] = hit
    records.kv_bytes[i] = cache.stats.kv_bytes
    records.ssm_bytes[i] = cache.stats.ssm_bytes


def with_inputs(trace: Trace | Iterable[Request]) -> Trace | Iterable[Request]:
    """`trace` without its requests whose input is empty (a conversation opening with an
    empty message, in a trace built by hand: the readers drop them as they load); each
    has nothing to look up or prefill. Dropping them is said on stderr, counted, the
    first named; a stream's are said when it ends."""
    if isinstance(trace, Trace):
        if all(r.input_tokens.shape[0] for r in trace.requests):
            return trace
        kept = tuple(r for r in trace.requests if r.input_tokens.shape[0])
        empty = [r for r in trace.requests if not r.input_tokens.shape[0]]
        _say_dropped(trace.name, len(empty), empty[0])
        return Trace(trace.name, kept, dict(trace.meta))
    return _stream_with_inputs(trace)


def _stream_with_inputs(trace: Iterable[Request]) -> Iterator[Request]:
    empty, first = 0, None
    for request in trace:
        if request.input_tokens.shape[0]:
            yield request
        else:
            empty, first = empty + 1, first or request
    if first is not None:
        _say_dropped("stream", empty, first)


def _say_dropped(name: str, count: int, first: Request) -> None:
    print(f"trace {name}: dropped {count:,} request{'s' * (count != 1)} with an empty "
          f"input (the first: session {first.session_id!r} turn {first.turn}): nothing to "
          "look up or prefill", file=sys.stderr)


def alpha_in_force(system: System, config: SimConfig, tuner: Tuner | None,
                   alpha: float) -> tuple[float | None, str | None]:
    """The alpha a run reports and how it was set (docs/architecture.md, the CLI
    contract): a tuned system whose tuner never finished reports None, never the 0.0 it
    evicted with while it waited; a system without an alpha reports None too."""
    if not system.uses_alpha:
        return None, None
    if config.alpha is not None or system.tuner is None:
        return alpha, "fixed"
    finished = tuner is not None and bool(getattr(tuner, "done", True))
    return (alpha, "tuned") if finished else (None, "untuned")


def _concurrent(trace: Iterable[Request], config: SimConfig, cache: PrefixCache,
                tuner: Tuner | None, records: Records,
                before: Callable[[int], None] | None) -> None:
    def record(i: int, request: Request, hit: int) -> None:
        _record(records, i, request, hit, cache)

    replay_concurrent(trace, cache, config.spec, config.latency_model(), config.decode_s_per_token,
                      record, before, tuner)


def _step(request: Request, i: int, cache: PrefixCache, tuner: Tuner | None,
          records: Records) -> None:
    tokens = request.tokens()
    if cache.admission.per_session:
        salt = request.session_id
        hit = cache.lookup(request.input_tokens, boundaries=request.boundaries, salt=salt).hit
        cache.commit(tokens, request.n_input, boundaries=request.boundaries, salt=salt)
    else:  # lookup of the input, commit of the whole, the tokens checked once
        hit = cache.serve_tokens(tokens, request.n_input, request.boundaries)
    if tuner is not None:
        tuner.observe(cache, tokens, request.n_input, request.boundaries, request.session_id)
    _record(records, i, request, hit, cache)


def _serve_batch(batch: list[Request], first: int, cache: PrefixCache,
                 records: Records) -> None:
    """`_step` for `batch`, requests `first`, `first + 1`, ... (no tuner to feed)."""
    end = first + len(batch)
    n_input = np.fromiter((r.n_input for r in batch), dtype=np.int64, count=len(batch))
    hits, kv, ssm = cache.serve_many([r.tokens() for r in batch], n_input,
                                     [r.boundaries for r in batch])
    records.n_input[first:end] = n_input
    records.n_output[first:end] = [r.n_output for r in batch]
    records.hit[first:end] = hits
    records.kv_bytes[first:end] = kv
    records.ssm_bytes[first:end] = ssm


def _bounds(request: Request, i: int, bound: PrefixCache, seen: SeenTree,
            records: Records) -> None:
    """Same system with unbounded capacity, and every prefix ever seen."""
    tokens = request.tokens()
    salt = request.session_id if bound.admission.per_session else None
    records.bound[i] = bound.lookup(request.input_tokens, boundaries=request.boundaries,
                                    salt=salt).hit
    bound.commit(tokens, request.n_input, boundaries=request.boundaries, salt=salt)
    found = seen.lookup(request.input_tokens)
    records.seen[i] = found.seen
    records.from_inputs[i] = found.from_inputs
    seen.commit(tokens, request.n_input)
