"""OpenAI request bodies (pydantic, strict types) and response bodies (plain dicts).

Fields the server cannot honour are refused with a 400 naming them rather than ignored;
unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from marconi.engine import Generation
from marconi.server.chat import Message


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False  # a last chunk with `usage` and no choices


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def to_message(self) -> Message:
        if isinstance(self.content, list):
            return Message(self.role, "".join(part.text for part in self.content))
        return Message(self.role, self.content or "")


class _Common(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=1)  # an extension, as in vLLM
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None  # refused below; the model's EOS still stops
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, value: str | list[str] | None) -> None:
        if value:
            raise ValueError("stop sequences are not supported by this server")
        return None


class CompletionRequest(_Common):
    prompt: str | list[int] = Field(union_mode="left_to_right")


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(gen: Generation) -> dict[str, Any]:
    """OpenAI usage; `cached_tokens` = prompt tokens served from the prefix cache."""
    n_out = len(gen.output)
    return {"prompt_tokens": gen.n_input, "completion_tokens": n_out,
            "total_tokens": gen.n_input + n_out,
            "prompt_tokens_details": {"cached_tokens": gen.hit}}


def completion_body(rid: str, model: str, text: str, reason: str,
                    gen: Generation) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
            "usage": usage(gen)}


def chat_body(rid: str, model: str, text: str, reason: str, gen: Generation) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reason,
                         "logprobs": None}],
            "usage": usage(gen)}


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
