"""The replay loop, written once: lookup -> (prefill) -> commit -> tuner, per request.

```python
result = simulate(trace, SimConfig(spec=PAPER_7B, capacity=2e9, system="marconi"))
result.summary()      # every figure, typed; .to_json(): `marconi simulate --json`
```
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from itertools import islice

import numpy as np
from tqdm import tqdm

from marconi.core.cache import PrefixCache
from marconi.core.layout import Layout
from marconi.core.serving import Serving, ServingStats, Visibility, replay_serving
from marconi.core.serving_native import Hook, Served, serve_compiled
from marconi.core.tuning import Tuner
from marconi.sim.bounds import UNBOUNDED, CompiledSeenTree, SeenTree, keep_all, seen_tree
from marconi.sim.concurrent import replay_concurrent
from marconi.sim.result import Records, SimConfig, SimResult, resized
from marconi.systems import System, TunerOptions, get_system
from marconi.workload.types import Request, Trace

Seeing = SeenTree | CompiledSeenTree  # the tree of every prefix, either core's
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
    serving = config.replay == "serving"
    if (config.concurrent or serving) and not isinstance(trace, Sized):
        raise ValueError(f"a {'serving' if serving else 'concurrent'} replay needs the whole "
                         "trace, not a stream (--replay sequential streams one)")
    trace = with_inputs(trace)
    system = system or get_system(config.system)
    # waits for its replays: a deterministic run. Served, a tuner with a first-boundary
    # expert starts on it, as `marconi serve` starts marconi+ (docs/architecture.md,
    # "marconi+'s regret")
    tuner = system.make_tuner(config.alpha, TunerOptions(
        wait=True, settings=config.settings(), first_boundary=serving,
        serving=serving_of(config, system) if serving else None))
    cache, bound = _caches(config, system)
    seen, dropped = seen_tree(bound), None
    records = Records.zeros(len(trace) if isinstance(trace, Sized) else STREAM_ROWS)
    arrivals, sessions = np.zeros(len(records)), []
    start = time.perf_counter()
    bar = tqdm(trace, desc=config.system, unit="req", leave=False,
               disable=None if progress else True)  # None: only on a terminal
    overlapping = config.concurrent or serving
    served_by: ServingStats | None = None
    if config.concurrent:
        _concurrent(trace, config, cache, tuner, records, before)
    elif serving:
        bounds = _ServedBounds(bound, seen, records, config.bounds_tokens)
        served_by = _serving(trace, config, system, cache, tuner, records, before, bounds)
        bound, dropped = None, bounds.dropped  # measured on the server's own timeline
    # once nothing but the cache sees each request (no tuner left to feed, no bounds, no
    # callback), requests are served in batches: the compiled core runs their loop
    batchable = not overlapping and before is None and not cache.admission.per_session
    if tuner is not None and not overlapping:
        tuner.start(cache)  # its first choice serves the first request, as in a server
    requests, served = iter(bar), 0
    for i, request in enumerate(requests):
        records, arrivals = _room(records, arrivals, i + 1)
        sessions.append(request.session_id)
        arrivals[i] = request.arrival
        served = i + 1
        if not overlapping:
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
        bounds_dropped=dropped, alpha_status=status, serving=served_by)


def _caches(config: SimConfig, system: System) -> tuple[PrefixCache, PrefixCache | None]:
    """The replayed cache and, with bounds, the unbounded one beside it."""
    # token-only: on the compiled core where it runs the system (a concurrent replay's
    # pins too)
    cache = system.cache(config.spec, config.capacity, alpha=config.alpha,
                         layout=config.layout, as_engine=True, replay=True)
    # the same pages, no state pool: nothing is ever evicted
    bound = system.cache(
        config.spec, UNBOUNDED, alpha=config.alpha,
        layout=Layout(page_size=config.layout.page_size), evict_with=keep_all,
        as_engine=True, replay=True) if config.bounds else None
    return cache, bound


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
    finished = tuner is not None and bool(getattr(tuner, "tuned", getattr(tuner, "done", True)))
    return (alpha, "tuned") if finished else (None, "untuned")


def _concurrent(trace: Iterable[Request], config: SimConfig, cache: PrefixCache,
                tuner: Tuner | None, records: Records,
                before: Callable[[int], None] | None) -> None:
    def record(i: int, request: Request, hit: int) -> None:
        _record(records, i, request, hit, cache)

    replay_concurrent(trace, cache, config.spec, config.latency_model(), config.decode_s_per_token,
                      record, before, tuner)


DEFAULT_CHUNK_TOKENS = 8192  # a step's tokens where the system's engine names none


def serving_of(config: SimConfig, system: System) -> Serving:
    """How the serving replay runs `system` under `config`: the batch limit, the step's
    tokens (given, else the system's engine's, else `DEFAULT_CHUNK_TOKENS`), the decode
    step, the latency model and the visibility rule (given, else the system's engine's)."""
    chunk = config.chunk_tokens or system.chunk_tokens or DEFAULT_CHUNK_TOKENS
    return Serving(max_running=config.max_running, chunk_tokens=chunk,
                   decode_s=config.decode_s_per_token, latency=config.latency_model(),
                   visibility=Visibility(config.visibility or system.visibility),
                   hold=config.hold_running)


def describe_replay(config: SimConfig) -> str:
    """One line naming the replay protocol and its settings (every table's header)."""
    if config.replay == "sequential":
        how = "concurrent arrivals, " if config.concurrent else ""
        return (f"replay sequential ({how}the paper's protocol: each request committed "
                "before the next is looked up)")
    chunk = (f"{config.chunk_tokens}-token steps" if config.chunk_tokens else
             f"steps of each engine's prefill chunk, else {DEFAULT_CHUNK_TOKENS} tokens")
    held = "running requests hold memory" if config.hold_running else \
        "running requests hold no memory"
    shown = {None: "", "finish": ", visible at the finish", "chunk": ", visible after each "
             "chunk", "block": ", visible as blocks fill"}[config.visibility]
    return (f"replay serving (up to {config.max_running} running, {chunk}{shown}, "
            f"{config.decode_s_per_token:g} s per decode step, {held}; TTFT from issue to "
            "first token)")


class _ServedBounds:
    """The bounds of a serving replay, on its own timeline: each request looked up in
    the unbounded cache and the tree of every prefix when it is scheduled, and committed
    to both when it finishes. A prefix that a running request is still computing is
    neither seen nor in the bound: no cache could have served it then."""

    def __init__(self, bound: PrefixCache | None, seen: Seeing, records: Records,
                 limit: int) -> None:
        self.bound, self.seen, self.records, self.limit = bound, seen, records, limit
        self.dropped: int | None = None
        self.finished = 0

    def lookup(self, i: int, request: Request) -> None:
        if self.bound is None:
            return
        salt = request.session_id if self.bound.admission.per_session else None
        self.records.bound[i] = self.bound.lookup(request.input_tokens,
                                                  boundaries=request.boundaries,
                                                  salt=salt).hit
        found = self.seen.lookup(request.input_tokens)
        self.records.seen[i] = found.seen
        self.records.from_inputs[i] = found.from_inputs

    def commit(self, i: int, request: Request, n: int, whole: bool) -> None:
        """Request `i`'s first `n` tokens committed: its finish (`whole`), or what it
        made visible while running."""
        self.finished += whole
        if self.bound is None:
            return
        salt = request.session_id if self.bound.admission.per_session else None
        tokens, n_input = (request.tokens(), request.n_input) if whole else \
            (request.input_tokens[:n], n)
        self.bound.commit(tokens, n_input, boundaries=tuple(
            b for b in request.boundaries if b <= n_input), salt=salt)
        self.seen.commit(tokens, n_input)
        if self.seen.tokens > self.limit:  # they would grow with the trace
            self.bound, self.seen, self.dropped = None, SeenTree(), self.finished


def _serving(trace: Trace | Iterable[Request], config: SimConfig, system: System,
             cache: PrefixCache, tuner: Tuner | None, records: Records,
             before: Callable[[int], None] | None, bounds: _ServedBounds) -> ServingStats:
    def record(i: int, request: Request, hit: int) -> None:
        _record(records, i, request, hit, cache)
        bounds.lookup(i, request)

    requests = trace.requests if isinstance(trace, Trace) else tuple(trace)
    if before is None:  # the compiled loop, the tuner told as the Python loop tells it
        served = serve_compiled(requests, cache, serving_of(config, system), bound=bounds.bound,
                                bound_limit=bounds.limit, hook=Hook(requests, cache, tuner=tuner))
        if served is not None:
            _served_records(records, requests, served)
            bounds.dropped = served.dropped
            return served.stats
    return replay_serving(requests, cache, serving_of(config, system), record, before, tuner,
                          on_commit=bounds.commit)


def _served_records(records: Records, requests: Sequence[Request], served: Served) -> None:
    """The records of a serving replay the compiled core ran (`_record`, `_ServedBounds`)."""
    records.n_input[:] = [r.n_input for r in requests]
    records.n_output[:] = [r.n_output for r in requests]
    records.hit[:] = served.hit
    records.kv_bytes[:] = served.kv_bytes
    records.ssm_bytes[:] = served.ssm_bytes
    records.bound[:] = served.bound
    records.seen[:] = served.seen
    records.from_inputs[:] = served.from_inputs


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


def _bounds(request: Request, i: int, bound: PrefixCache, seen: Seeing,
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
