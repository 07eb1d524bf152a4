"""Request bodies, from bytes to a validated request, with bounds on what one may hold.

Decoding and validating JSON are long C calls that hold the GIL from start to end (for
30 MiB of `{"role": "user"}` messages, seconds of pydantic), so neither the event loop
nor a worker thread can run them without stalling `/health` and every other client. A
body over `INLINE_BODY` bytes is therefore parsed in a separate process (`BodyParser`),
which sends back only what the handler needs: the request's scalar fields, and for a
chat its messages already flattened to text. The bounds are checked there too, before
anything big is sent back:

- `Limits.messages` / `Limits.parts`: a chat's messages, and its text parts in all (a
  400 naming the flag), from a skim of a big body before it is decoded (`skim_chat`)
  and from the decoded JSON before it is validated;
- `Limits.chars`: text that cannot fit the context (`CHARS_PER_TOKEN` a token);
- a completion's token-id prompt longer than the context, and an unknown model, from a
  skim of the body before it is decoded at all (`skim_completion`).

A small body is parsed on the event loop by the same code (a process round trip costs
more than the parse).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, Literal, TypeVar

import msgspec
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from marconi.server.chat import Message
from marconi.server.errors import ApiError, bad_request
from marconi.server.schemas import ChatRequest, CompletionRequest

log = logging.getLogger("marconi.server")
Kind = Literal["chat", "completion"]
Body = TypeVar("Body", bound=BaseModel)

INLINE_BODY = 64 << 10  # bytes of body parsed on the event loop; larger ones in a process
CHARS_PER_TOKEN = 32  # text over this x the context is refused untokenized (Mistral
# v1's longest piece is 16 characters: such a text cannot fit)
MODEL_NAME_SHOWN = 200  # characters of an unknown model name a 404 quotes back


@dataclass(frozen=True, slots=True)
class Limits:
    """What one body may hold (sent to the parser process with each body)."""

    served: str  # the model's name: a body naming another is refused (404)
    context: int  # the model's context, in tokens
    messages: int  # most messages in a chat
    parts: int  # most content parts in a chat, all messages together

    @property
    def chars(self) -> int:
        return CHARS_PER_TOKEN * self.context


@dataclass(frozen=True, slots=True)
class Parsed(Generic[Body]):
    """A validated body; for a chat, its messages flattened to text (and the body's own
    `messages` left empty: they are not sent back from the parser process)."""

    body: Body
    messages: list[Message] | None = None


@dataclass(frozen=True, slots=True)
class _Refusal:
    """An error raised in the parser process, as plain data (exceptions with keyword
    arguments do not survive pickling)."""

    status: int = 400
    message: str = ""
    kind: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    invalid: list[dict[str, Any]] | None = None  # a RequestValidationError's errors

    def raise_it(self) -> None:
        if self.invalid is not None:
            raise RequestValidationError(self.invalid)
        raise ApiError(self.status, self.message, self.kind, self.param, self.code)


def check_model(name: str, served: str) -> None:
    if name != served:
        shown = name if len(name) <= MODEL_NAME_SHOWN else \
            f"{name[:MODEL_NAME_SHOWN]}... ({len(name)} characters)"
        raise ApiError(404, f"The model `{shown}` does not exist; this server serves "
                       f"`{served}`.", param="model", code="model_not_found")


def check_chars(n: int, field: str, context: int) -> None:
    limit = CHARS_PER_TOKEN * context
    if n > limit:
        raise bad_request(
            f"{field}: {n} characters cannot fit this model's maximum context length of "
            f"{context} tokens (text over {limit} characters is refused before it is "
            "tokenized)", param=field, code="context_length_exceeded")


class _Shape(msgspec.Struct):
    """What `skim_completion` reads of a completion body: the model, and the prompt left
    as raw JSON."""

    model: Any = None
    prompt: msgspec.Raw = msgspec.Raw(b"")


_decode_shape = msgspec.json.Decoder(_Shape).decode


class _MessageShape(msgspec.Struct):
    """What `skim_chat` reads of a message: its content, each part left as raw JSON."""

    content: list[msgspec.Raw] | str | None = None


class _ChatShape(msgspec.Struct):
    messages: list[_MessageShape] | None = None


_decode_chat_shape = msgspec.json.Decoder(_ChatShape).decode


def skim_chat(raw: bytes, limits: Limits) -> None:
    """Refuse a chat body of more messages or content parts than the limits from a skim
    (msgspec passes over each part without building it, many times faster than decoding
    a million small objects). A body the skim cannot read (one
    whose messages are not all objects, say) is left to the full parse."""
    try:
        shape = _decode_chat_shape(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return
    if shape.messages is not None:
        _check_messages(len(shape.messages), limits)
        _check_parts(sum(len(m.content) for m in shape.messages
                         if isinstance(m.content, list)), limits)


def skim_completion(raw: bytes, limits: Limits) -> None:
    """Refuse a completion body whose model is unknown or whose token-id prompt has more
    ids than the context holds, from a skim of the JSON (msgspec passes over the prompt
    without building it; its commas count its ids). Anything else, a body that is not
    JSON included, is left to the full parse and its errors."""
    try:
        shape = _decode_shape(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):  # not JSON: left to the parse
        return
    if isinstance(shape.model, str):
        check_model(shape.model, limits.served)
    prompt = memoryview(shape.prompt)
    if not prompt or prompt[0] != ord("["):
        return
    ids = prompt.tobytes().count(b",") + 1  # a flat list of ids: one more than commas
    if ids > limits.context:
        raise bad_request(
            f"prompt: {ids} token ids cannot fit this model's maximum context length of "
            f"{limits.context} tokens (refused before they are read)", param="prompt",
            code="context_length_exceeded")


def parse(raw: bytes, kind: Kind, limits: Limits) -> Parsed[Any]:
    """`raw` as the endpoint's request; ApiError (400, 404) or RequestValidationError."""
    if kind == "completion":
        skim_completion(raw, limits)
    elif len(raw) > INLINE_BODY:  # a small body decodes as fast as it skims
        skim_chat(raw, limits)
    value = _decoded(raw)
    if kind == "chat":
        _count_messages(value, limits)
    model = ChatRequest if kind == "chat" else CompletionRequest
    try:
        body = model.model_validate(value)
    except ValidationError as err:
        raise RequestValidationError([_plain(e) for e in err.errors(
            include_url=False, include_input=False)]) from None
    if isinstance(body, CompletionRequest):
        if isinstance(body.prompt, str):
            check_chars(len(body.prompt), "prompt", limits.context)
        return Parsed(body)
    assert isinstance(body, ChatRequest)
    messages = [m.to_message() for m in body.messages]
    check_chars(sum(len(m.content) for m in messages), "messages", limits.context)
    return Parsed(body.model_copy(update={"messages": []}), messages)


def _plain(error: Any) -> dict[str, Any]:
    """A pydantic error as data that pickles (its context's exceptions as text), without
    the input (which may be the whole body)."""
    context = {k: str(v) for k, v in error.get("ctx", {}).items()}
    return {**error, "loc": ("body", *error["loc"]), "ctx": context}


def _decoded(raw: bytes) -> Any:
    try:  # UTF-8 only: json.loads would take bytes in UTF-16 or UTF-32 as well
        return json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", err.pos),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": err.msg}}]) from None
    except UnicodeDecodeError as err:
        raise bad_request(f"request body is not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise bad_request("request body: JSON nested too deeply") from None


def _check_messages(n: int, limits: Limits) -> None:
    if n > limits.messages:
        raise bad_request(f"messages: {n} messages; this server takes at most "
                          f"{limits.messages} (--max-messages)", param="messages",
                          code="array_above_max_length")


def _count_messages(value: Any, limits: Limits) -> None:
    """Refuse more messages or content parts than the limits, before validating them
    (validation costs microseconds an item: a million would take seconds)."""
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list):
        return
    _check_messages(len(messages), limits)
    _check_parts(sum(len(m["content"]) for m in messages
                     if isinstance(m, dict) and isinstance(m.get("content"), list)), limits)


def _check_parts(n: int, limits: Limits) -> None:
    if n > limits.parts:
        raise bad_request(f"messages: {n} content parts in all; this server takes at "
                          f"most {limits.parts} (--max-content-parts)", param="messages",
                          code="array_above_max_length")


def _parse_in_child(raw: bytes, kind: Kind, limits: Limits) -> Parsed[Any] | _Refusal:
    """`parse` in the parser process: its errors returned as data."""
    try:
        return parse(raw, kind, limits)
    except ApiError as err:
        return _Refusal(err.status, err.message, err.kind, err.param, err.code)
    except RequestValidationError as err:
        return _Refusal(invalid=list(err.errors()))
    except Exception as err:  # a bug: answered 500, and the process lives on
        return _Refusal(500, f"internal error: {type(err).__name__}: {err}", "internal_error")


_HEADER = struct.Struct("<Q")  # the length of what follows, on the parser process's pipes


class BodyParser:
    """Parses bodies over `INLINE_BODY` in one worker process, started on first use and
    replaced if it dies. The process is `python -m marconi.server.parsing` talking over
    its stdin and stdout (not multiprocessing, whose spawned children re-run the parent's
    main script); a body is written to it unpickled, and one request at a time (a queue
    of big bodies waits its turn, as big prompts wait for the tokenizer thread)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marconi-parser")

    async def parse(self, chunks: list[bytes], kind: Kind) -> Parsed[Any]:
        """The body read in `chunks` (as received: a big body is never joined into one
        bytes object here, whose allocation and copy alone would stall the event loop)."""
        size = sum(len(chunk) for chunk in chunks)
        if size <= INLINE_BODY:
            return parse(b"".join(chunks), kind, self.limits)
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._thread, self._exchange, chunks, size,
                                                kind)
        except OSError as err:
            log.warning("the body parser process stopped while parsing a %d-byte body (%s); "
                        "a new one parses the next", size, err)
            raise ApiError(500, "internal error: the request body's parser process "
                           "stopped", "internal_error") from None
        if isinstance(result, _Refusal):
            result.raise_it()
        assert isinstance(result, Parsed)
        return result

    def _exchange(self, chunks: list[bytes], size: int, kind: Kind) -> Parsed[Any] | _Refusal:
        """One body to the process and its answer back (on the parser thread)."""
        proc = self._process()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            head = pickle.dumps((kind, self.limits, size))
            proc.stdin.write(_HEADER.pack(len(head)) + head)
            proc.stdin.writelines(chunks)
            proc.stdin.flush()
            answer = pickle.loads(_read(proc.stdout, _HEADER.unpack(
                _read(proc.stdout, _HEADER.size))[0]))
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            self._stop()
            raise OSError(f"{type(err).__name__}: {err}") from None
        assert isinstance(answer, Parsed | _Refusal)
        return answer

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            package = str(Path(__file__).resolve().parents[2])  # where `marconi` is
            path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "marconi.server.parsing"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()

    def close(self) -> None:
        self._thread.submit(self._stop)
        self._thread.shutdown(wait=False)


def _read(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"the parser process sent {len(data)} of {n} bytes")
    return data


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The parser process: bodies in, parsed requests (or refusals) out, until EOF."""
    while header := stdin.read(_HEADER.size):
        kind, limits, size = pickle.loads(_read(stdin, _HEADER.unpack(header)[0]))
        answer = pickle.dumps(_parse_in_child(_read(stdin, size), kind, limits))
        stdout.write(_HEADER.pack(len(answer)) + answer)
        stdout.flush()


if __name__ == "__main__":  # answers pickled by the module's own name, not __main__'s
    from marconi.server import parsing

    answers = os.fdopen(os.dup(1), "wb")  # the pipe to the server, for answers alone:
    os.dup2(2, 1)  # whatever else writes to stdout goes to stderr
    sys.stdout = sys.stderr
    parsing._serve(sys.stdin.buffer, answers)
