"""OpenAI response bodies (plain dicts): completions, chat completions, usage, errors."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not at run time: the body parser's process imports errors, and so this
    from marconi.engines.hf import Generation


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(gen: Generation) -> dict[str, Any]:
    """OpenAI usage; `cached_tokens` = prompt tokens served from the prefix cache."""
    n_out = len(gen.output)
    return {"prompt_tokens": gen.n_input, "completion_tokens": n_out,
            "total_tokens": gen.n_input + n_out,
            "prompt_tokens_details": {"cached_tokens": gen.hit}}


def completion_body(rid: str, model: str, text: str, reason: str, gen: Generation,
                    logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(gen)}


def chat_body(rid: str, model: str, text: str, reason: str, gen: Generation,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": logprobs}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(gen)}


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
