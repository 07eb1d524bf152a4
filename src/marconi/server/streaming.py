"""Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

```
data: {"object": "chat.completion.chunk", "choices": [{"delta": {"role": "assistant"}}]}
data: {... "choices": [{"delta": {"content": "text"}, "finish_reason": null}]}     (repeated)
data: {... "choices": [{"delta": {}, "finish_reason": "length"}]}
data: {... "choices": [], "usage": {...}}        (only with stream_options.include_usage)
data: [DONE]
```
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from marconi.server.bodies import error_body, usage
from marconi.server.errors import ApiError
from marconi.server.service import Finished, Service, Submission

log = logging.getLogger("marconi.server")

Choice = Callable[[str | None, str | None], dict[str, Any]]  # (text, finish_reason) -> choice


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


def chat_choice(text: str | None, reason: str | None) -> dict[str, Any]:
    delta = {} if text is None else {"content": text}
    return {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}


def completion_choice(text: str | None, reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}


class ChunkStream:
    """Turns a submission's deltas into SSE lines for one endpoint's chunk type."""

    def __init__(self, service: Service, sub: Submission, *, rid: str, model: str,
                 chat: bool, include_usage: bool) -> None:
        self.service, self.sub = service, sub
        self.include_usage = include_usage
        self.choice: Choice = chat_choice if chat else completion_choice
        self.head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model}
        self.chat = chat

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {**self.head, "choices": choices, **extra}
        if self.include_usage and "usage" not in body:
            body["usage"] = None
        return sse(body)

    async def lines(self) -> AsyncIterator[str]:
        """Every SSE line of the response; a failure mid-stream becomes an error event."""
        if self.chat:
            yield self.chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "finish_reason": None, "logprobs": None}])
        try:
            async for item in self.service.deltas(self.sub):
                if isinstance(item, Finished):
                    yield self._final(item)
                else:
                    yield self.chunk([self.choice(item, None)])
        except ApiError as err:
            yield sse(error_body(err.message, err.kind, err.param, err.code))
        except (asyncio.CancelledError, GeneratorExit):  # the client left: the stream closed
            log.info("%s: the client disconnected mid-stream; its request was cancelled",
                     self.head["id"])
            raise
        yield sse("[DONE]")

    def _final(self, done: Finished) -> str:
        last = self.chunk([self.choice(None, done.reason)])
        if self.include_usage:
            last += self.chunk([], usage=usage(done.generation))
        return last
