"""OpenAI request bodies: pydantic models with strict types.

Fields the server cannot honour are refused with a 400 naming them rather than ignored
(`REFUSED`: each with the values that mean "not used", which pass); fields it does not
know are ignored, as OpenAI-compatible servers do. Text must be valid Unicode: a lone
surrogate (JSON's `"\\ud800"`) is refused here, before a tokenizer or a response body
meets it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from marconi.server.chat import Message


def _unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"contains a lone surrogate (U+{ord(value[err.start]):04X}) at "
                         f"character {err.start}; text must be valid Unicode") from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # OpenAI's integer range

_TOOLS = "this server's model cannot call tools (send no tools, or tool_choice \"none\")"
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {  # field: (values that pass, why not)
    "stop": ((None, "", []), "stop sequences are not supported by this server (the "
             "model's end-of-sequence token still stops it)"),
    "frequency_penalty": ((None, 0), "penalties are not supported by this server"),
    "presence_penalty": ((None, 0), "penalties are not supported by this server"),
    "logit_bias": ((None, {}), "logit_bias is not supported by this server"),
    "echo": ((None, False), "echo is not supported by this server"),
    "suffix": ((None, ""), "suffix (insertion) is not supported by this server"),
    "best_of": ((None, 1), "best_of > 1 is not supported by this server"),
    "response_format": ((None, {"type": "text"}), "only {\"type\": \"text\"} is supported"),
    "tool_choice": ((None, "none", "auto"), _TOOLS),
    "tools": ((None, []), _TOOLS),
    "functions": ((None, []), _TOOLS),
    "function_call": ((None, "none", "auto"), _TOOLS),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    # vLLM's extensions a client may send, which would change the output if ignored
    "stop_token_ids": ((None, []), "stop_token_ids are not supported by this server"),
    "min_tokens": ((None, 0), "min_tokens is not supported by this server"),
    "ignore_eos": ((None, False), "ignore_eos is not supported by this server"),
    "repetition_penalty": ((None, 1), "penalties are not supported by this server"),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False  # a last chunk with `usage` and no choices


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart] | None = None

    def to_message(self) -> Message:
        if isinstance(self.content, list):
            return Message(self.role, "".join(part.text for part in self.content))
        return Message(self.role, self.content or "")


class _Common(BaseModel):
    """Fields both endpoints share, and the refusal of what neither can honour."""

    model_config = ConfigDict(strict=True)

    model: Text
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=1)  # an extension, as in vLLM
    seed: Int64 | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    stop: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None
    stop_token_ids: Any = None
    min_tokens: Any = None
    ignore_eos: Any = None
    repetition_penalty: Any = None

    @field_validator("stream", "n", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """`null` means the default, as OpenAI reads it."""
        if value is None:
            return False if info.field_name == "stream" else 1
        return value

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, value: Any) -> Any:
        """0 and -1 turn top-k off, as vLLM reads them."""
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, -1):
            return None
        return value

    @field_validator(*REFUSED, mode="before", check_fields=False)
    @classmethod
    def _refuse(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        passes, why = REFUSED[name]
        if name == "tools" and info.data.get("tool_choice") == "none":
            return None  # tools the client says not to call: nothing to honour
        if value not in passes:  # by equality: 0.0 passes as 0
            raise ValueError(why)
        return value

    @field_validator("logprobs", check_fields=False)
    @classmethod
    def _no_streamed_logprobs(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value is not False and info.data.get("stream"):  # 0 too
            raise ValueError("log probabilities are not available when streaming "
                             "(stream: true)")
        return value


class CompletionRequest(_Common):
    prompt: Text | list[int] = Field(union_mode="left_to_right")
    logprobs: int | None = Field(default=None, ge=0, le=5)  # alternatives per token
    echo: Any = None
    suffix: Any = None
    best_of: Any = None
    response_format: Any = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and any(isinstance(v, str | list) for v in value):
            raise ValueError("a list of prompts (a batch) is not supported: send one prompt "
                             "(text or token ids) per request")
        return value

    def alternatives(self) -> int | None:
        """Most likely tokens to list beside each chosen one; None: no log probabilities."""
        return self.logprobs


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: Any = None
    tool_choice: Any = None  # before `tools`: "none" lets tools pass
    tools: Any = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
