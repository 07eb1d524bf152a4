"""The serving replay: a trace replayed as a server runs it (docs/architecture.md, "Replay
protocols").

```
issue --> waiting (FCFS) --schedule: lookup, pin, reserve--> prefill in chunks --> decode
  ^                                                                                   |
  +---- the session's next turn: finish + the trace's think gap <--commit, unpin------+
```
A server runs steps. Each step spends a token budget (`chunk_tokens`, vLLM's
`--max-num-batched-tokens`, SGLang's chunked prefill size): one token for each running
request that decodes, then prefill chunks for the running requests still prefilling, then
new requests taken from the waiting queue in order while fewer than `max_running` run
(vLLM's `--max-num-seqs`). A request is looked up when it is scheduled, not when it
arrives; it then holds, beside the cache and in the same capacity (`cache.reserve`), the
KV of every token it will compute and one working state: a busy server caches less. A
request whose footprint does not fit waits (and those behind it) until running ones
finish or free memory, and is looked up again then; one that cannot fit even in an empty
cache runs without its reservation, counted.
A step lasts the prefill time of its chunks (the latency model, per chunk, with the
tokens already computed as its cached context) plus `decode_s` when a request decodes in
it; a request's first token comes at the end of its last prefill chunk, its last after
`n_output - 1` more steps, and then it commits and unpins. What a running request has
computed is visible to others when the system's engine makes it so (`Visibility`).

A session's turn whose input extends its previous turn's input and output (chat, agents:
the next turn depends on the answer) is issued when that turn finishes plus the trace's
gap between the two stamps (the user's typing, the tool's run), not at its own stamp: a
closed loop. Every other request (Mooncake's, a session's first turn, a turn that does
not extend the last) is issued at its stamp.

With one request running at a time, no two requests overlapping and no memory held by the
running request (`Serving.hold` off), it commits each request before the next is looked
up: the sequential replay's figures (tests/test_serving.py).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast

import numpy as np

from marconi.core.cache import PrefixCache
from marconi.core.tuning import Tuner


class Request(Protocol):
    """What the server reads of a request (`marconi.workload.Request` is one)."""

    @property
    def session_id(self) -> Any: ...

    @property
    def arrival(self) -> float: ...

    @property
    def input_tokens(self) -> np.ndarray: ...

    @property
    def boundaries(self) -> Sequence[int]: ...

    @property
    def n_input(self) -> int: ...

    @property
    def n_output(self) -> int: ...

    def tokens(self) -> np.ndarray: ...


class LatencyModel(Protocol):
    """Seconds to prefill (`marconi.sim.latency`'s models are ones)."""

    def ttft(self, n_input: np.ndarray, hit: np.ndarray) -> np.ndarray: ...


class Follower(Protocol):
    """A tuner whose own caches are served on the live server's timeline (marconi+'s
    shadows, each through a `Mirror`): told of each lookup, show and finish as it happens,
    the finish before the tuner's `observe`."""

    def scheduled(self, cache: PrefixCache, i: int, request: Request, hit: int) -> None: ...

    def shown(self, i: int, request: Request, n: int) -> None: ...

    def finished(self, i: int, request: Request) -> None: ...


class Visibility(StrEnum):
    """When what a running request computed becomes visible to the others."""

    FINISH = "finish"  # at its finish, the whole sequence (marconi's engine)
    CHUNK = "chunk"  # its input so far after each prefill chunk but the last (SGLang)
    BLOCK = "block"  # its input so far after every prefill step, as blocks fill (vLLM)


@dataclass(frozen=True, slots=True)
class Serving:
    """How the server runs: its batch limit, its step's token budget, a decode step's
    seconds, the latency model of a prefill chunk, and its engine's visibility rule."""

    max_running: int
    chunk_tokens: int
    decode_s: float
    latency: LatencyModel
    visibility: Visibility = Visibility.FINISH
    hold: bool = True  # running requests hold memory beside the cache (`cache.reserve`)

    def __post_init__(self) -> None:
        if self.max_running < 1 or self.chunk_tokens < 1 or self.decode_s < 0:
            raise ValueError(f"serving: max_running={self.max_running!r} and chunk_tokens="
                             f"{self.chunk_tokens!r} must be >= 1, decode_s="
                             f"{self.decode_s!r} >= 0")


@dataclass(slots=True)
class ServingStats:
    """What the server did: requests that waited (left in the queue by a step, for the
    batch limit, the step's budget or memory), the most running at once, requests that ran
    without their reservation (larger than the cache), and the time the last finished."""

    waited: int = 0
    max_running: int = 0
    unreserved: int = 0
    makespan: float = 0.0
    issued: np.ndarray = field(default_factory=lambda: np.zeros(0))  # issue time per request
    scheduled: np.ndarray = field(default_factory=lambda: np.zeros(0))  # lookup time
    first_token: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(slots=True, eq=False)
class _Running:
    i: int
    seq: int  # admission order (ties between finishes at one step)
    request: Request
    node: Any  # the node it pinned (its lookup's, then its visible prefix's)
    hit: int
    done: int  # input tokens computed (cached ones included)
    kv: int  # bytes reserved beside the cache
    states: int  # states reserved beside the cache
    shown: int  # input tokens made visible before its finish


def _salt(cache: PrefixCache, request: Request) -> Any:
    """The request's session, where the system keeps a namespace per session."""
    return request.session_id if cache.admission.per_session else None


def _page_bytes(cache: PrefixCache, tokens: int) -> int:
    """The KV bytes of `tokens` tokens in the cache's whole pages."""
    page = cache.layout.page_size
    return math.ceil(max(tokens, 0) / page) * page * cache.spec.kv_bytes_per_token


def _show(cache: PrefixCache, r: _Running, n: int) -> bool:
    """Commit `r`'s first `n` input tokens, so that later lookups may use them; its pin
    moves to what the commit kept, and the tokens shown leave its reservation. They and its
    working state leave the reservation before the commit, which makes room for what the
    engine then holds (their KV, the states it checkpoints, its working states): held by
    both, they would be counted twice and evict for memory nobody holds. Its working state
    is then held again (and, where the commit kept nothing, the tokens too); what no longer
    fits runs unheld, as a request larger than the cache does (`r.states` 0). False when
    the commit kept nothing (refused)."""
    request = r.request
    kv, states = min(_page_bytes(cache, n - r.shown), r.kv), r.states
    cache.release(kv, states)
    result = cache.commit(request.input_tokens[:n], n,
                          boundaries=tuple(b for b in request.boundaries if b <= n),
                          salt=_salt(cache, request))
    if result.node is not None:
        cache.pin(result.node)
        cache.unpin(r.node)
        r.node = result.node
        r.kv -= kv
        r.shown = n
        kv = 0
    if (kv or states) and not cache.reserve(kv, states):
        r.kv -= kv
        r.states = 0
    return result.node is not None


def _commit_whole(cache: PrefixCache, r: _Running) -> np.ndarray:
    """`r` finished: its memory and its pin go back first (an engine frees a finished
    request's blocks, which stay cached), then its whole sequence is committed; its
    tokens."""
    request = r.request
    cache.release(r.kv, r.states)
    cache.unpin(r.node)
    tokens = request.tokens()
    cache.commit(tokens, request.n_input, boundaries=request.boundaries,
                 salt=_salt(cache, request))
    return tokens


# (index, request, hit) at each lookup; the request as the caller gave it
Record = Callable[[int, Any, int], None]


def dependents(requests: Sequence[Request]) -> list[int]:
    """For each request, the index of the earlier request it waits for (its session's
    previous turn, when its input extends that turn's input and output), or -1."""
    last: dict[Any, int] = {}
    out = [-1] * len(requests)
    for i, r in enumerate(requests):
        j = last.get(r.session_id)
        if j is not None:
            prev = requests[j]
            n = prev.n_input + prev.n_output
            if r.n_input > n and np.array_equal(r.input_tokens[:n], prev.tokens()):
                out[i] = j
        last[r.session_id] = i
    return out


def replay_serving(requests: Sequence[Request], cache: PrefixCache, serving: Serving,
                   record: Record, before: Callable[[int], None] | None = None,
                   tuner: Tuner | None = None, *, closed_loop: bool = True,
                   on_commit: Callable[[int, Any, int, bool], None] | None = None
                   ) -> ServingStats:
    """Serve `requests` (arrival order) as `serving` says; `record(i, request, hit)` at each
    lookup, `before(i)` before it; `tuner` observes each commit (told the request's issue
    time). `closed_loop=False`: every request issued at its own stamp (a tuner's window,
    stamped with the live run's issue times). `on_commit(i, request, n, done)` after each
    commit of its first `n` tokens (`done`: its finish, n its whole length; else what it
    made visible while running); the simulator's bounds commit there, on the same timeline."""
    server = _Server(requests, cache, serving, record, before, tuner, closed_loop)
    server.on_commit = on_commit
    return server.run()


class _Server:
    """The step loop. Decoding requests are not walked each step: each has the step its
    last token comes at (`ends`, a heap), and a stretch of steps in which nothing
    prefills is jumped over to the next finish or issue."""

    def __init__(self, requests: Sequence[Request], cache: PrefixCache, serving: Serving,
                 record: Record, before: Callable[[int], None] | None,
                 tuner: Tuner | None, closed_loop: bool) -> None:
        self.requests, self.cache, self.s = requests, cache, serving
        self.record, self.before, self.tuner = record, before, tuner
        self.after = dependents(requests) if closed_loop else [-1] * len(requests)
        self.next_of: dict[int, int] = {j: i for i, j in enumerate(self.after) if j >= 0}
        n = len(requests)
        self.stats = ServingStats(issued=np.full(n, np.nan), scheduled=np.full(n, np.nan),
                                  first_token=np.full(n, np.nan), finished=np.full(n, np.nan))
        self.pending: list[tuple[float, int]] = [
            (r.arrival, i) for i, r in enumerate(requests) if self.after[i] < 0]
        heapq.heapify(self.pending)
        self.waiting: deque[int] = deque()
        self.queued_at = np.zeros(n, dtype=np.int64)  # schedule rounds before it queued
        self.rounds = 0  # schedule rounds done
        self.blocked = False  # the queue's head did not fit: no retry before memory frees
        self.prefilling: list[_Running] = []  # in admission order
        self.ends: list[tuple[int, int, _Running]] = []  # (last token's step, seq, request)
        self.running = 0
        self.steps = 0  # steps run so far
        self.seq = 0
        self.now = 0.0
        self.on_commit: Callable[[int, Any, int, bool], None] | None = None
        # a tuner whose own caches follow the server's events (marconi+'s shadows)
        self.follower = cast("Follower | None", tuner if hasattr(tuner, "scheduled") else None)

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> ServingStats:
        while self.pending or self.waiting or self.running:
            self._issue()
            if not self.running and not self.waiting:
                self.now = max(self.now, self.pending[0][0])
                continue
            chunks, blocked = self._schedule()
            self.stats.max_running = max(self.stats.max_running, self.running)
            if chunks:
                self._step(chunks)
            elif self.ends:
                self._decode_until_event(blocked)
            else:  # nothing runs, nothing could start
                raise AssertionError("serving replay: a request could not be scheduled")
        self.stats.makespan = self.now
        return self.stats

    def _issue(self) -> None:
        """Move what has been issued by now into the waiting queue, in issue order."""
        while self.pending and self.pending[0][0] <= self.now:
            t, i = heapq.heappop(self.pending)
            self.stats.issued[i] = t
            self.queued_at[i] = self.rounds
            self.waiting.append(i)

    def _schedule(self) -> tuple[list[tuple[_Running, int]], bool]:
        """This step's prefill chunks (running requests first, then new ones while the
        budget, the batch limit and memory allow), and whether the waiting queue is held
        back (by the batch limit, the budget or memory) rather than empty."""
        budget = self.s.chunk_tokens - (self.running - len(self.prefilling))
        chunks = []
        for r in self.prefilling:
            if budget <= 0:
                break
            c = min(r.request.n_input - r.done, budget)
            chunks.append((r, c))
            budget -= c
        while (self.waiting and budget > 0 and self.running < self.s.max_running
               and not self.blocked):
            started = self._start(self.waiting[0])
            if started is None:  # asked again once a running request frees memory
                self.blocked = True
                break
            self.waiting.popleft()
            c = min(started.request.n_input - started.done, budget)
            chunks.append((started, c))
            budget -= c
        self.rounds += 1
        return chunks, bool(self.waiting)

    def _start(self, i: int) -> _Running | None:
        """Look request `i` up, pin its hit and reserve its footprint; None (nothing
        kept) when it does not fit beside the running ones yet."""
        request, cache = self.requests[i], self.cache
        if self.before is not None:
            self.before(i)
        plan = cache.lookup(request.input_tokens, boundaries=request.boundaries,
                            salt=_salt(cache, request))
        cache.pin(plan.node)
        kv, states = _page_bytes(cache, request.n_input + request.n_output - plan.hit), 1
        if not self.s.hold:
            kv, states = 0, 0
        elif not cache.reserve(kv, states):
            if self.running:
                cache.unpin(plan.node)
                return None  # its lookup is asked again when it is scheduled
            kv, states = 0, 0  # larger than the cache even alone: it runs, counted
            self.stats.unreserved += 1
        self.record(i, request, plan.hit)
        if self.follower is not None:
            self.follower.scheduled(cache, i, request, plan.hit)
        self.stats.scheduled[i] = self.now
        self.stats.waited += int(self.rounds > self.queued_at[i])  # left by an earlier round
        # a full hit still computes its last token (the logits of the first output)
        done = min(plan.hit, request.n_input - 1)
        run = _Running(i=i, seq=self.seq, request=request, node=plan.node, hit=plan.hit,
                       done=done, kv=kv, states=states, shown=plan.hit)
        self.seq += 1
        self.running += 1
        self.prefilling.append(run)
        return run

    # --- steps -------------------------------------------------------------------------

    def _step(self, chunks: list[tuple[_Running, int]]) -> None:
        """One step: the chunks prefill, every running request past its prefill decodes
        one token; then what finished commits."""
        decoding = self.running - len(self.prefilling)
        each = getattr(self.s.latency, "chunk_seconds", None)  # a scalar form, if it has one
        if each is not None:
            seconds = sum(each(r.done, c) for r, c in chunks)
        else:
            done = np.array([r.done for r, _ in chunks], dtype=np.int64)
            size = np.array([c for _, c in chunks], dtype=np.int64)
            seconds = float(self.s.latency.ttft(done + size, done).sum())
        self.now += seconds + (self.s.decode_s if decoding else 0.0)
        self.steps += 1
        prefilled = False
        for r, c in chunks:
            r.done += c
            if r.done >= r.request.n_input:  # its first token: the rest decode from here
                prefilled = True
                self.stats.first_token[r.i] = self.now
                heapq.heappush(self.ends, (self.steps + max(r.request.n_output - 1, 0),
                                           r.seq, r))
                if self.s.visibility is Visibility.BLOCK:
                    self._show(r)
            elif self.s.visibility is not Visibility.FINISH:
                self._show(r)
        if prefilled:
            self.prefilling = [r for r in self.prefilling if r.done < r.request.n_input]
        self._finish_done()

    def _decode_until_event(self, blocked: bool) -> None:
        """Steps in which every running request only decodes: jump to the first finish,
        or to the next issue when a waiting request could then start."""
        k = self.ends[0][0] - self.steps
        if not blocked and self.pending and self.s.decode_s > 0:
            k = min(k, max(1, math.ceil((self.pending[0][0] - self.now) / self.s.decode_s)))
        k = max(k, 1)
        self.now += k * self.s.decode_s
        self.steps += k
        self._finish_done()

    def _show(self, r: _Running) -> None:
        """Make `r`'s input computed so far visible (`_show`, above)."""
        n = r.done
        if n <= r.shown:
            return
        held = r.states
        kept = _show(self.cache, r, n)
        if held and not r.states:
            self.stats.unreserved += 1
        if self.follower is not None:
            self.follower.shown(r.i, r.request, n)
        if self.on_commit is not None:
            self.on_commit(r.i, r.request, n, False)
        if kept:
            self.blocked = False  # its reservation shrank

    def _finish_done(self) -> None:
        while self.ends and self.ends[0][0] <= self.steps:
            self._finish(heapq.heappop(self.ends)[2])

    def _finish(self, r: _Running) -> None:
        cache, request = self.cache, r.request
        self.running -= 1
        self.blocked = False
        tokens = _commit_whole(cache, r)
        if self.follower is not None:
            self.follower.finished(r.i, request)
        if self.tuner is not None:
            self.tuner.observe(cache, tokens, request.n_input, request.boundaries,
                               request.session_id, arrival=float(self.stats.issued[r.i]))
        if self.on_commit is not None:
            self.on_commit(r.i, request, len(tokens), True)
        self.stats.finished[r.i] = self.now
        nxt = self.next_of.get(r.i)
        if nxt is not None:
            think = self.requests[nxt].arrival - request.arrival
            heapq.heappush(self.pending, (self.now + max(think, 0.0), nxt))


class Mirror:
    """Another cache served on a live server's timeline, event by event: each request
    looked up when the live one was scheduled (its hit pinned and, `hold`, its footprint
    reserved as the server reserves it; a footprint that does not fit runs unreserved, as
    the live request ran), its input made visible when the live one showed it, and
    committed whole when the live one finished. What `replay_timeline` and marconi+'s
    served shadows replay with."""

    def __init__(self, cache: PrefixCache, hold: bool = True) -> None:
        self.cache, self.hold = cache, hold
        self.running: dict[int, _Running] = {}

    def lookup(self, i: int, request: Request) -> int:
        """Request `i` is scheduled: its hit here."""
        cache = self.cache
        plan = cache.lookup(request.input_tokens, boundaries=request.boundaries,
                            salt=_salt(cache, request))
        cache.pin(plan.node)
        kv = _page_bytes(cache, request.n_input + request.n_output - plan.hit) if self.hold \
            else 0
        states = 1 if self.hold else 0
        if not cache.reserve(kv, states):
            kv, states = 0, 0  # the server ran it: so does its mirror, unreserved
        self.running[i] = _Running(i=i, seq=i, request=request, node=plan.node, hit=plan.hit,
                                   done=request.n_input, kv=kv, states=states, shown=plan.hit)
        return plan.hit

    def show(self, i: int, n: int) -> None:
        """Request `i`'s first `n` input tokens are visible (`_show`)."""
        r = self.running.get(i)
        if r is not None and n > r.shown:
            _show(self.cache, r, n)

    def finish(self, i: int, request: Request) -> None:
        """Request `i` finished: its memory and pin go back and it commits whole; one this
        cache never looked up (built after its lookup) just commits."""
        r = self.running.pop(i, None)
        if r is not None:
            _commit_whole(self.cache, r)
        else:
            self.cache.commit(request.tokens(), request.n_input, boundaries=request.boundaries,
                              salt=_salt(self.cache, request))


def replay_timeline(requests: Sequence[Request], cache: PrefixCache, scheduled: np.ndarray,
                    prefilled: np.ndarray, finished: np.ndarray, record: Record, *,
                    visibility: Visibility = Visibility.FINISH, hold: bool = True) -> None:
    """Replay `requests` on a given timeline instead of a modelled one (a served run's:
    what `bench_serve` reads from the server): request i is looked up at `scheduled[i]`
    (its hit pinned and, `hold`, its footprint reserved as `replay_serving` reserves it),
    its input made visible at `prefilled[i]` where the engine shows blocks as they fill
    (`Visibility.BLOCK`; CHUNK and FINISH wait for the finish), and committed whole at
    `finished[i]`. At equal times commits come before lookups (an engine frees and caches
    a finished request's blocks before it schedules the next step), and each request's own
    events keep their order."""
    n = len(requests)
    if not (len(scheduled) == len(prefilled) == len(finished) == n):
        raise ValueError(f"replay_timeline: {n} requests but {len(scheduled)}, "
                         f"{len(prefilled)} and {len(finished)} times")
    bad = [i for i in range(n) if not scheduled[i] <= prefilled[i] <= finished[i]]
    if bad:
        raise ValueError(f"replay_timeline: request {bad[0]} is scheduled at "
                         f"{scheduled[bad[0]]}, prefilled at {prefilled[bad[0]]} and finished "
                         f"at {finished[bad[0]]}: not in that order")
    # (time, rank, i, kind): at one time shows, then finishes, then lookups, then the
    # shows and finishes of requests looked up at that very time
    events = [(float(scheduled[i]), 1.0, i, "lookup") for i in range(n)]
    events += [(float(finished[i]), 0.0 if finished[i] > scheduled[i] else 3.0, i, "finish")
               for i in range(n)]
    if visibility is Visibility.BLOCK:
        events += [(float(prefilled[i]), -1.0 if prefilled[i] > scheduled[i] else 2.0, i,
                    "show") for i in range(n)]
    events.sort()
    mirror = Mirror(cache, hold)
    for _, _, i, kind in events:
        request = requests[i]
        if kind == "lookup":
            record(i, request, mirror.lookup(i, request))
        elif kind == "show":
            mirror.show(i, request.n_input)
        else:
            mirror.finish(i, request)
