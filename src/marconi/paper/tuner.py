"""The bootstrap alpha tuner (docs/architecture.md, "Tuner").

alpha = 0 until the cache first evicts. Then, with `n0` the requests seen so far, the
tuner snapshots the tree, records the next `multiplier * n0` requests, replays them
from the snapshot under every alpha of the grid (in parallel, on any
`concurrent.futures.Executor`) and adopts the best. That is the paper's tuner
(`retune=False`). With `retune` (marconi's default, `--no-retune` for the paper's) it
goes on: from each adoption it snapshots the tree again, records the next window of the
same length, replays it and adopts its best, and so on to the end of the trace, so that
the alpha that won one window is not kept for ever once the trace moves on (on the
demo's ShareGPT served at 4 GB the first window's 1.7 is the worst alpha for the rest of
the trace: experiments/RESULTS.md), and its windows are at most `MAX_WINDOW` requests, so
that it finishes on the traces operators replay (on the agent trajectories at 80 GB the
cache fills after some 800 requests, and 5 x 800 outlasts their 3,562; and windows of 250
requests follow a trace that shifts, where 1,000 kept the previous part's alpha for the
first 1,000 requests after it: experiments/RESULTS.md). Its cost: every
request is replayed once per alpha of the grid, in the background. And it is guarded
(`Guard`): a token-only twin of the live cache runs alpha 0 on the same requests (served
as the live cache is), and when, since the last adoption of an alpha other than 0, the
twin has saved decisively more than the live cache (`core.tuning.decisive`, checked every
`DECIDE_EVERY` requests, as marconi+'s shadows decide), alpha 0 is restored until the next
adoption: a window's best alpha can keep the long prefixes of finished sessions for ever
and collapse the hits of the windows after it (ShareGPT served at 3 GB: alpha 1.3 wins
requests 438-804 and then saves a fifth of what alpha 0 does; experiments/RESULTS.md).

By default a replay never blocks the driver: it runs on one background (daemon) thread,
or on the executor the caller passes, and its alpha is adopted by a later `observe`, on
the driver's thread. `wait=True` asks for the result at once (the simulator does, to stay
deterministic); without an executor it then runs on local processes, or on the calling
thread once torch is loaded: a fork of a process holding torch's thread pools may hang,
and a `forkserver`'s state does not survive the forks of a process pool (a sweep's).
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from marconi.core.cache import PrefixCache
from marconi.core.compiled import replay_cache
from marconi.core.orphans import die_with_parent
from marconi.core.policy import Admission, Eviction
from marconi.core.serving import Mirror, Request, Serving
from marconi.core.serving_native import compiled_loop, replay_serving, serve_compiled
from marconi.core.snapshot import Snapshot, rebuild, take
from marconi.core.tuning import (
    ALPHA_GRID,
    DECIDE_EVERY,
    DECISIVE_LEAD,
    RETUNE_WINDOW,
    Objective,
    decisive,
    hit_worth,
)

GRID = ALPHA_GRID  # 0, 0.1, ..., 2.0
MAX_WINDOW = RETUNE_WINDOW  # a re-tuning tuner's window at most (module docstring)
INLINE_WINDOW = 128  # a waiting tuner replays shorter windows on its own thread

Replay = tuple[np.ndarray, int]  # input + output tokens, input length


@dataclass(frozen=True, slots=True)
class Policies:
    """Empty policies of the live cache, to copy for each replay (picklable)."""

    admission: Admission
    eviction: Eviction  # one with an alpha (FlopAware, peers' MambaRadixFlop)

    def cache(self, snapshot: Snapshot, alpha: float) -> PrefixCache:
        """A fresh cache running these policies at `alpha`, holding the snapshot (on the
        compiled core where it runs them: `marconi.core.compiled`)."""
        cache = replay_cache(snapshot.spec, snapshot.capacity, copy.deepcopy(self.admission),
                             self.eviction.fresh(alpha), layout=snapshot.layout)
        rebuild(snapshot, cache)
        return cache


def replay(snapshot: Snapshot, policies: Policies, requests: Sequence[Replay],
           alphas: Sequence[float], objective: Objective) -> dict[float, float]:
    """Objective reached by each alpha when `requests` run from `snapshot`, one after
    another (the sequential replay's protocol)."""
    out = {}
    for alpha in alphas:
        cache = policies.cache(snapshot, alpha)
        out[alpha] = sum(hit_worth(cache, tokens, n_input, (), objective)
                         for tokens, n_input in requests)
    return out


@dataclass(frozen=True, slots=True)
class Job:
    """A request of the window as the serving replay reads it: its tokens, its input's
    length and boundaries, its session and the time the live run issued it."""

    all_tokens: np.ndarray
    n_input: int
    boundaries: tuple[int, ...]
    session_id: Any
    arrival: float

    @property
    def input_tokens(self) -> np.ndarray:
        return self.all_tokens[: self.n_input]

    @property
    def n_output(self) -> int:
        return len(self.all_tokens) - self.n_input

    def tokens(self) -> np.ndarray:
        return self.all_tokens


def replay_served(snapshot: Snapshot, policies: Policies, jobs: Sequence[Job],
                  alphas: Sequence[float], objective: Objective,
                  serving: Serving) -> dict[float, float]:
    """Objective reached by each alpha when `jobs` are served from `snapshot` as the live
    cache is (`marconi.core.serving`): overlapping, each issued when the live run issued
    it, looked up when scheduled."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival)
    ordered = [jobs[i] for i in order]
    out = {}
    for alpha in alphas:
        cache = policies.cache(snapshot, alpha)
        served = serve_compiled(ordered, cache, serving, closed_loop=False)
        if served is not None:  # the hits in the order the requests were looked up
            hits = served.hit[served.order].tolist()
        else:
            hits = []
            replay_serving(ordered, cache, serving, _appender(hits), closed_loop=False)
        out[alpha] = (float(snapshot.spec.flops_array(np.array(hits, dtype=np.int64)).sum())
                      if objective is Objective.FLOPS else float(sum(hits)))
    return out


def _appender(hits: list[int]) -> Callable[[int, Any, int], None]:
    def record(i: int, job: Any, hit: int) -> None:
        hits.append(hit)

    return record


@dataclass(slots=True)
class Tuning:
    """One finished tuning: when it started, what each alpha scored, what won."""

    n0: int  # requests before the first eviction
    window: int  # requests replayed
    scores: dict[float, float] = field(default_factory=dict)  # the last window's
    alpha: float = 0.0
    # (requests committed when adopted, alpha) for each window tuned (retune: many)
    adopted: list[tuple[int, float]] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)  # requests committed when the guard
    # restored alpha 0

    def to_json(self) -> dict[str, object]:
        """When tuning started, the window, the last window's scores and winner, and
        every adoption."""
        return {"n0": self.n0, "window": self.window,
                "alpha": self.alpha if self.scores else None,
                "scores": {str(a): s for a, s in sorted(self.scores.items())},
                "adopted": [[at, alpha] for at, alpha in self.adopted],
                "restored": list(self.restored)}


class BootstrapTuner:
    """Chooses alpha for a FLOP-aware cache by replaying a bootstrap window."""

    def __init__(self, *, grid: Sequence[float] = GRID, multiplier: int = 5,
                 objective: Objective | str = Objective.FLOPS, executor: Executor | None = None,
                 wait: bool = False, serving: Serving | None = None,
                 retune: bool = False, max_window: int | None = None) -> None:
        if not grid or any(a < 0 for a in grid):
            raise ValueError(f"alpha grid must be non-empty and >= 0, got {list(grid)!r}")
        if not isinstance(multiplier, int) or multiplier < 1:
            raise ValueError(f"bootstrap multiplier must be a positive integer, got {multiplier!r}")
        self.grid = tuple(float(a) for a in grid)
        self.multiplier = multiplier
        self.objective = Objective(objective)
        self.executor = executor
        self.wait = wait
        self.serving = serving  # replay windows as the live cache is served; None: in turn
        self.retune = retune  # tune again on each following window (module docstring)
        if max_window is not None and max_window < 1:
            raise ValueError(f"a re-tuning window holds at least one request, got "
                             f"max_window={max_window!r}")
        self.max_window = max_window  # None: MAX_WINDOW
        self.result: Tuning | None = None
        self._snapshot: Snapshot | None = None
        self._recorded: list[Replay] = []
        self._jobs: list[Job] = []
        self._futures: list[Future[dict[float, float]]] = []
        self.guard: Guard | None = None  # retune: built with the first request seen

    @property
    def tuned(self) -> bool:
        """An alpha has been adopted (its first window replayed)."""
        return self.result is not None and bool(self.result.adopted)

    @property
    def done(self) -> bool:
        """Nothing more to observe: tuned once, and not retuning."""
        return self.tuned and not self._futures and not self.retune

    def observe(self, cache: PrefixCache, tokens: np.ndarray, n_input: int,
                boundaries: Sequence[int] = (), session: str | None = None, *,
                arrival: float | None = None) -> None:
        """Called by the driver after every commit. Serving (`self.serving`), each request
        of the window is kept with its session and the time it was issued (`arrival`),
        to be served again as the live cache served it; else its tokens alone."""
        if self.done:
            return
        if self.retune:
            if self.guard is None:
                self.guard = Guard(cache, self.objective)
            if self.guard.observe(cache, tokens, n_input, boundaries):
                assert self.result is not None  # guarding: an alpha was adopted
                self.result.restored.append(cache.stats.commits)
                cache.eviction.set_alpha(0.0)
        if self._futures:
            self._adopt_if_ready(cache)
        elif self._snapshot is None:
            if self.result is not None and self.result.adopted:  # retune: the next window
                self._snapshot = take(cache)
            elif cache.stats.evictions:
                n0 = cache.stats.commits
                window = self.multiplier * n0
                cap = MAX_WINDOW if self.max_window is None else self.max_window
                self.result = Tuning(n0=n0, window=min(window, cap) if self.retune
                                     else window)
                self._snapshot = take(cache)
        else:
            if self.serving is not None:
                if arrival is None:
                    raise ValueError("the bootstrap tuner of a serving replay needs each "
                                     "request's issue time (observe(..., arrival=))")
                self._jobs.append(Job(np.asarray(tokens), n_input, tuple(boundaries),
                                      session, float(arrival)))
            self._recorded.append((tokens, n_input))
            if self.result is not None and len(self._recorded) >= self.result.window:
                self._launch(cache)

    def _launch(self, cache: PrefixCache) -> None:
        assert self._snapshot is not None
        eviction = cache.eviction
        if eviction.alpha is None:  # FlopAware, or any eviction with an alpha to tune
            raise ValueError(f"the bootstrap tuner needs FLOP-aware eviction, cache "
                             f"{cache.name!r} runs {type(eviction).__name__}")
        policies = Policies(copy.deepcopy(cache.admission), eviction.fresh(0.0))
        # served replays on the compiled core run their loop without the GIL: threads
        threads = self.serving is not None and compiled_loop(cache, self.serving)
        executor = self.executor or _local_executor(len(self.grid), self.wait,
                                                    len(self._recorded), threads)
        chunks = [self.grid[i :: _workers(executor)] for i in range(_workers(executor))]
        if self.serving is not None:
            self._futures = [executor.submit(replay_served, self._snapshot, policies,
                                             self._jobs, chunk, self.objective, self.serving)
                             for chunk in chunks if chunk]
        else:
            self._futures = [executor.submit(replay, self._snapshot, policies,
                                             self._recorded, chunk, self.objective)
                             for chunk in chunks if chunk]
        self._snapshot, self._recorded, self._jobs = None, [], []
        if self.wait:
            self._adopt(cache)
        if self.executor is None:
            executor.shutdown(wait=self.wait)

    def _adopt_if_ready(self, cache: PrefixCache) -> None:
        if all(f.done() for f in self._futures):
            self._adopt(cache)

    def _adopt(self, cache: PrefixCache) -> None:
        assert self.result is not None
        scores: dict[float, float] = {}
        for future in self._futures:
            scores.update(future.result())
        self._futures = []
        # best score; among ties the smallest alpha (closest to plain LRU)
        best = max(scores.items(), key=lambda kv: (kv[1], -kv[0]))
        self.result.scores, self.result.alpha = scores, best[0]
        self.result.adopted.append((cache.stats.commits, best[0]))
        cache.eviction.set_alpha(best[0])
        if self.guard is not None:
            self.guard.arm(best[0] != 0.0)

    # --- a served run's events (`marconi.core.serving.Follower`): the guard's twin -------

    def scheduled(self, cache: PrefixCache, i: int, request: Request, hit: int) -> None:
        if self.retune:
            if self.guard is None:
                self.guard = Guard(cache, self.objective)
            self.guard.scheduled(i, request, hit)

    def shown(self, i: int, request: Request, n: int) -> None:
        if self.guard is not None:
            self.guard.mirror.show(i, n)

    def finished(self, i: int, request: Request) -> None:
        if self.guard is not None:
            self.guard.mirror.finish(i, request)

    def start(self, cache: PrefixCache) -> None:
        """Nothing to set up: alpha stays as the cache has it until a replay is adopted."""

    def report(self) -> Tuning | None:
        """The finished tuning, if any (`Tuning.to_json` for the summary)."""
        return self.result


class Guard:
    """A token-only twin of the live cache at alpha 0, fed the same requests (in turn, or
    served on the live server's timeline through a `Mirror`), and the books since the
    last adoption of an alpha other than 0 (module docstring)."""

    def __init__(self, cache: PrefixCache, objective: Objective) -> None:
        self.twin = replay_cache(cache.spec, cache.capacity, copy.deepcopy(cache.admission),
                                 cache.eviction.fresh(0.0), name=f"{cache.name} alpha-0 twin",
                                 layout=cache.layout)
        self.mirror = Mirror(self.twin)
        self.objective = objective
        self.served = False  # fed by a serving replay's events
        self.books: list[float] | None = None  # [live, twin, possible, requests] since
        self._hits = 0  # the live cache's hit tokens at the last observe (in turn)

    def _worth(self, hit: int) -> float:
        return float(self.twin.spec.flops(hit)) if self.objective is Objective.FLOPS \
            else float(hit)

    def arm(self, on: bool) -> None:
        """An alpha was adopted: guard it from now (`on`: not alpha 0), books from zero."""
        self.books = [0.0, 0.0, 0.0, 0.0] if on else None

    def scheduled(self, i: int, request: Request, hit: int) -> None:
        """A served run looked request `i` up, the live cache's hit `hit`."""
        self.served = True
        twin = self.mirror.lookup(i, request)
        if self.books is not None:
            self.books[0] += self._worth(hit)
            self.books[1] += self._worth(twin)

    def observe(self, cache: PrefixCache, tokens: np.ndarray, n_input: int,
                boundaries: Sequence[int]) -> bool:
        """After each commit of the live cache: in turn, the twin serves the request too;
        True when alpha 0 is to be restored now (and guarding stops until the next
        adoption)."""
        if not self.served:
            twin = hit_worth(self.twin, tokens, n_input, boundaries, self.objective)
            hits = cache.stats.hit_tokens
            hit, self._hits = max(hits - self._hits, 0), hits  # this request's (one lookup)
            if self.books is not None:
                self.books[0] += self._worth(hit)
                self.books[1] += twin
        if self.books is None:
            return False
        self.books[2] += self._worth(n_input)
        self.books[3] += 1
        live, twin_saved, possible, seen = self.books
        if seen % DECIDE_EVERY or not decisive(twin_saved - live, possible, int(seen),
                                               DECISIVE_LEAD):
            return False
        self.books = None
        return True


def _workers(executor: Executor) -> int:
    return getattr(executor, "_max_workers", None) or os.cpu_count() or 1


def _local_executor(tasks: int, wait: bool, window: int | None = None,
                    threads: bool = False) -> Executor:
    """Where replays run when the caller gave no executor: one background thread when
    nobody waits, else local processes, never forked from a process holding torch, nor
    for a window shorter than `INLINE_WINDOW` requests (the calling thread then: starting
    processes costs more than such a window's replays, which a re-tuning tuner on small
    windows would pay hundreds of times); `threads` (served replays whose loop the compiled
    core runs without the GIL): threads, which share the window instead of copying it."""
    if not wait:
        return Background()
    if window is not None and window < INLINE_WINDOW:
        return Inline()
    if threads:  # no fork: safe beside torch too
        return ThreadPoolExecutor(max_workers=max(1, min(tasks, os.cpu_count() or 1)))
    if "torch" in sys.modules:
        return Inline()
    # its processes die with this one: a sweep's `stop` SIGKILLs the worker running us
    return ProcessPoolExecutor(max_workers=max(1, min(tasks, os.cpu_count() or 1)),
                               initializer=die_with_parent, initargs=(os.getpid(),))


class Inline(Executor):
    """Each task at submit, on the calling thread."""

    _max_workers = 1

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # raised again by whoever adopts the result
            future.set_exception(err)
        return future


class Background(Executor):
    """Each task on a daemon thread of its own (an exiting process does not wait for a
    replay nobody will adopt)."""

    _max_workers = 1

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # handed to whoever adopts the result
                future.set_exception(err)

        threading.Thread(target=run, name="marconi-tuner", daemon=True).start()
        return future


def bootstrap_tuner(settings: Mapping[str, object], *, executor: Executor | None = None,
                    wait: bool = False, serving: Serving | None = None) -> BootstrapTuner:
    """A `BootstrapTuner` with the run's `multiplier`, `objective`, `retune` and
    `retune_window` among `settings` (absent: its defaults; `retune` absent: on, marconi's
    default); `serving`: the live cache's server, whose way its windows are replayed."""
    return BootstrapTuner(multiplier=cast(int, settings.get("multiplier", 5)),
                          objective=Objective(settings.get("objective", Objective.FLOPS)),
                          executor=executor, wait=wait, serving=serving,
                          retune=bool(settings.get("retune", True)),
                          max_window=cast("int | None", settings.get("retune_window")))
