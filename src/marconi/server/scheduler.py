"""A bounded queue in front of one engine worker thread: requests run one at a time.

```
handler --submit--> [ queue (max_queue) ] --> worker thread: engine.generate(on_token)
   ^                                                        |
   +------ events (Token..., Done | Failed), thread-safe ---+
```
A full queue raises `QueueFull` (the app answers 429). A job whose client went away is
`cancel`led: taken out of the queue at once if still waiting (its slot is free for the
next request), stopped at its next token if running (either way counted as finished with
reason `abort`). A generation that raises is
counted as a failure and reported to its client; the worker lives on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from marconi.engines.hf import Engine, Generation, Sampling
from marconi.server.metrics import ServerMetrics

log = logging.getLogger("marconi.server")


class QueueFull(Exception):
    """The scheduler's queue holds `max_queue` waiting requests already."""


@dataclass(frozen=True, slots=True)
class Token:
    token: int


@dataclass(frozen=True, slots=True)
class Done:
    generation: Generation
    finish_reason: str  # "stop" (a stop token), "length", or "abort" (client gone)


@dataclass(frozen=True, slots=True)
class Failed:
    error: Exception


Event = Token | Done | Failed


@dataclass(slots=True, kw_only=True, eq=False)  # compared by identity (`cancel`)
class Job:
    """One request as the worker sees it."""

    prompt: list[int]
    boundaries: tuple[int, ...] = ()  # message ends in the prompt (chat), for admission
    max_tokens: int
    sampling: Sampling | None
    stop_ids: frozenset[int]  # generation ends after any of these
    emit: Callable[[Event], object]  # thread-safe: called from the worker thread
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrival: float = field(default_factory=time.perf_counter)


class Scheduler:
    """Owns the worker thread; `submit` never blocks."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, max_queue: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self._waiting: deque[Job] = deque()  # guarded by `_changed`
        self._changed = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="marconi-engine", daemon=True)
        self.running = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the running request finish, drop the waiting ones, end the thread."""
        with self._changed:
            for job in self._waiting:
                job.cancelled.set()
            self._waiting.clear()
            self._stopping = True
            self._changed.notify()
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue `job`; QueueFull if `max_queue` requests already wait."""
        with self._changed:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"the server's queue is full ({self.max_queue} requests "
                                "waiting); retry later")
            self._waiting.append(job)
            self._changed.notify()

    def cancel(self, job: Job) -> None:
        """`job`'s client has gone: a waiting job leaves the queue now (counted as an
        abort), a running one stops at its next token; a finished one is left as it is."""
        job.cancelled.set()
        with self._changed:
            if job not in self._waiting:
                return
            self._waiting.remove(job)
        self.metrics.success.labels(finished_reason="abort").inc()

    def _next(self) -> Job | None:
        """The next waiting job, once there is one; None when stopping."""
        with self._changed:
            while not self._waiting and not self._stopping:
                self._changed.wait()
            return None if self._stopping else self._waiting.popleft()

    def _run(self) -> None:
        while (job := self._next()) is not None:
            if job.cancelled.is_set():  # cancelled (`job.cancelled`) but not through `cancel`
                self.metrics.success.labels(finished_reason="abort").inc()
                continue
            self.running = 1
            try:
                end = self._execute(job)
            finally:
                self.running = 0  # before the client hears: metrics agree with it
            job.emit(end)

    def _execute(self, job: Job) -> Done | Failed:
        first = True

        def on_token(token: int) -> bool:
            nonlocal first
            if first:
                self.metrics.ttft.observe(time.perf_counter() - job.arrival)
                first = False
            job.emit(Token(token))
            return not job.cancelled.is_set() and token not in job.stop_ids

        try:
            gen = self.engine.generate(job.prompt, job.max_tokens, job.sampling,
                                       on_token=on_token, boundaries=job.boundaries)
        except Exception as err:  # reported to the client, the worker lives on
            self.metrics.failure(self.engine, err)
            if not isinstance(err, ValueError):  # a 500: the operator needs the traceback
                log.exception("generation failed (answered 500)")
            return Failed(err)
        reason = _finish_reason(job, gen)
        self.metrics.finished(self.engine, gen, reason, time.perf_counter() - job.arrival)
        return Done(gen, reason)


def _finish_reason(job: Job, gen: Generation) -> str:
    if len(gen.output) and int(gen.output[-1]) in job.stop_ids:
        return "stop"
    if job.cancelled.is_set() and len(gen.output) < job.max_tokens:
        return "abort"
    return "length"
