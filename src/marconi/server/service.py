"""From a validated request to a finished (or streamed) generation.

`Service.submit` checks the model name and the context length, then queues a `Job`
whose events cross from the worker thread into the request's asyncio queue. `collect`
waits for the whole output (watching for a client that leaves); `events` yields text
deltas as they come. Either way, a request whose client is gone is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from marconi.engine import Generation, Sampling
from marconi.server.backend import Backend
from marconi.server.chat import Detokenizer
from marconi.server.errors import ApiError, bad_request
from marconi.server.metrics import ServerMetrics
from marconi.server.scheduler import Done, Event, Failed, Job, QueueFull, Scheduler, Token
from marconi.server.schemas import _Common

POLL_S = 0.25  # how often a waiting non-streaming handler checks its client is still there


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a request: its full text, why it stopped, and the engine's result."""

    text: str
    reason: str
    generation: Generation


@dataclass(slots=True)
class Submission:
    job: Job
    events: asyncio.Queue[Event]
    detok: Detokenizer


class Service:
    """Glue between HTTP handlers, the codec and the scheduler."""

    def __init__(self, backend: Backend, scheduler: Scheduler, metrics: ServerMetrics,
                 default_max_tokens: int) -> None:
        self.backend, self.scheduler, self.metrics = backend, scheduler, metrics
        self.default_max_tokens = default_max_tokens

    def check_model(self, name: str) -> None:
        if name != self.backend.name:
            raise ApiError(404, f"The model `{name}` does not exist; this server serves "
                           f"`{self.backend.name}`.", param="model", code="model_not_found")

    def submit(self, body: _Common, prompt: list[int], requested: int | None,
               field: str, boundaries: tuple[int, ...] = ()) -> Submission:
        """Queue one generation; ApiError 400 (too long), 404 (model) or 429 (queue full)."""
        self.check_model(body.model)
        if not prompt:
            raise bad_request(f"{field}: the prompt has no tokens", param=field)
        max_tokens = self._max_tokens(len(prompt), requested, field)
        sampling = Sampling(temperature=body.temperature or 0.0, top_k=body.top_k,
                            seed=body.seed or 0)
        loop, events = asyncio.get_running_loop(), asyncio.Queue[Event]()
        eos = self.backend.codec.eos_id
        stop = frozenset() if eos is None else frozenset({eos})
        job = Job(prompt=prompt, boundaries=boundaries, max_tokens=max_tokens,
                  sampling=sampling, stop_ids=stop,
                  emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        try:
            self.scheduler.submit(job)
        except QueueFull as err:
            self.metrics.rejected.labels(reason="queue_full").inc()
            raise ApiError(429, str(err), "rate_limit_error", code="queue_full") from None
        return Submission(job, events, Detokenizer(self.backend.codec, stop))

    def _max_tokens(self, n_prompt: int, requested: int | None, field: str) -> int:
        limit = self.backend.max_context
        room = limit - n_prompt
        if requested is None and room >= 1:
            return min(self.default_max_tokens, room)
        wanted = requested if requested is not None else 1
        if wanted > room:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {n_prompt + wanted} tokens ({n_prompt} in the {field}, {wanted} "
                "in the completion). Please reduce the length of the prompt or completion.",
                param=field, code="context_length_exceeded")
        return wanted

    async def collect(self, sub: Submission, request: Request) -> Finished:
        """Wait for the whole output; cancels the job if the client disconnects."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(sub.events.get(), POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        raise asyncio.CancelledError from None
                    continue
                if (done := self._step(sub, event)) is not None:
                    return done
        finally:
            sub.job.cancelled.set()  # a no-op once finished

    async def deltas(self, sub: Submission) -> AsyncIterator[str | Finished]:
        """Text deltas, then the `Finished` record; the caller cancels on disconnect."""
        try:
            while True:
                event = await sub.events.get()
                if isinstance(event, Token):
                    if text := sub.detok.push(event.token):
                        yield text
                    continue
                if tail := sub.detok.flush():
                    yield tail
                done = self._step(sub, event)
                assert done is not None
                yield done
                return
        finally:
            sub.job.cancelled.set()

    def _step(self, sub: Submission, event: Event) -> Finished | None:
        """Feed one event; the `Finished` record at the end, ApiError on failure."""
        if isinstance(event, Token):
            sub.detok.push(event.token)
            return None
        if isinstance(event, Failed):
            if isinstance(event.error, ValueError):
                raise bad_request(str(event.error))
            raise ApiError(500, f"generation failed: {event.error}", "internal_error")
        assert isinstance(event, Done)
        sub.detok.flush()
        self.backend.codec.remember(sub.detok.text, [int(t) for t in event.generation.output])
        return Finished(sub.detok.text, event.finish_reason, event.generation)
