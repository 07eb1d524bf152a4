"""From a validated request to a finished (or streamed) generation.

Nothing slow runs on the event loop: `encode` and `render` refuse text that could never
fit the context before tokenizing it, then tokenize on a tokenizer thread (both
tokenizers release the GIL), so one huge prompt never stalls `/health` or other clients.
`submit` checks the context length and queues a `Job` whose events cross from the worker
thread into the request's asyncio queue. `collect` waits for the whole output (None when
the client left); `deltas` yields text deltas as they come. Either way, a request whose
client is gone is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request

from marconi.engines.hf import Generation, Sampling
from marconi.server.backend import Backend
from marconi.server.chat import Detokenizer, Message
from marconi.server.errors import ApiError, bad_request
from marconi.server.logprobs import TokenLogprob, token_logprobs
from marconi.server.metrics import ServerMetrics
from marconi.server.parsing import check_chars, check_model
from marconi.server.scheduler import Done, Event, Failed, Job, QueueFull, Scheduler, Token
from marconi.server.schemas import _Common

POLL_S = 0.25  # how often a waiting non-streaming handler checks its client is still there


INLINE_TOKENS = 1 << 16  # token-id prompts checked on the event loop; longer ones off it
RETRY_AFTER_S = 1  # what a 429 tells the client to wait: requests here take about that
T = TypeVar("T")


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
        # one thread: tokenizers need not be thread-safe, and a flood of big prompts
        # queues here instead of taking every core from the engine
        self._tokenizer = ThreadPoolExecutor(max_workers=1,
                                             thread_name_prefix="marconi-tokenizer")

    def close(self) -> None:
        self._tokenizer.shutdown(wait=False, cancel_futures=True)

    def check_model(self, name: str) -> None:
        check_model(name, self.backend.name)

    async def encode(self, prompt: str | list[int]) -> list[int]:
        """A completion's prompt as token ids (a text tokenized off the event loop)."""
        if isinstance(prompt, list):  # a long one is checked off the event loop too
            if len(prompt) <= INLINE_TOKENS:
                return self._token_prompt(prompt)
            return await self._off_loop(self._token_prompt, prompt)
        self._check_chars(len(prompt), "prompt")
        return await self._off_loop(self.backend.codec.encode_prompt, prompt)

    async def render(self, messages: Sequence[Message]) -> tuple[list[int], tuple[int, ...]]:
        """A chat's prompt and its message ends, rendered off the event loop."""
        self._check_chars(sum(len(m.content) for m in messages), "messages")
        try:
            return await self._off_loop(self.backend.codec.render, messages)
        except ValueError as err:
            raise bad_request(str(err), param="messages") from None

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer, fn, *args)

    def _check_chars(self, n: int, field: str) -> None:
        check_chars(n, field, self.backend.max_context)

    def _token_prompt(self, tokens: list[int]) -> list[int]:
        vocab = self.backend.engine.model.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"prompt: token id {bad[0]} outside the vocabulary "
                              f"[0, {vocab})", param="prompt")
        return tokens

    def submit(self, body: _Common, prompt: list[int], requested: int | None,
               field: str, boundaries: tuple[int, ...] = ()) -> Submission:
        """Queue one generation; ApiError 400 (empty, too long) or 429 (queue full)."""
        if not prompt:
            raise bad_request(f"{field}: the prompt has no tokens", param=field)
        max_tokens = self._max_tokens(len(prompt), requested, field)
        sampling = Sampling(temperature=body.temperature or 0.0, top_k=body.top_k,
                            top_p=body.top_p or 1.0, seed=body.seed or 0)
        loop, events = asyncio.get_running_loop(), asyncio.Queue[Event]()
        eos = self.backend.codec.eos_id
        stop = frozenset() if eos is None else frozenset({eos})
        job = Job(prompt=prompt, boundaries=boundaries, max_tokens=max_tokens,
                  sampling=sampling, stop_ids=stop,
                  emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        try:
            self.scheduler.submit(job)
        except QueueFull as err:
            raise ApiError(429, str(err), "rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
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

    async def collect(self, sub: Submission, request: Request) -> Finished | None:
        """Wait for the whole output; None (the job cancelled) if the client disconnects.

        The client is checked at every token and every `POLL_S` without one: tokens that
        come faster than that must not hide a client that left.
        """
        try:
            while True:
                try:
                    event: Event | None = await asyncio.wait_for(sub.events.get(), POLL_S)
                except TimeoutError:
                    event = None
                if await request.is_disconnected():
                    return None
                if event is not None and (done := self._step(sub, event)) is not None:
                    return done
        finally:
            self.scheduler.cancel(sub.job)  # a no-op once finished

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
            self.scheduler.cancel(sub.job)

    async def logprobs(self, sub: Submission, done: Finished, top: int) -> list[TokenLogprob]:
        """Log probabilities of the output's text tokens (computed off the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(
            None, token_logprobs, done.generation, self.backend.codec.token_bytes,
            sub.job.stop_ids, top)

    def _step(self, sub: Submission, event: Event) -> Finished | None:
        """Feed one event; the `Finished` record at the end, ApiError on failure."""
        if isinstance(event, Token):
            sub.detok.push(event.token)
            return None
        if isinstance(event, Failed):
            if isinstance(event.error, ValueError):  # counted as failures, not rejections
                raise ApiError(400, str(event.error), rejects=False)
            raise ApiError(500, f"generation failed: {event.error}", "internal_error")
        assert isinstance(event, Done)
        sub.detok.flush()
        self.backend.codec.remember(sub.detok.text, [int(t) for t in event.generation.output])
        return Finished(sub.detok.text, event.finish_reason, event.generation)
