"""Parsing OpenAI chat request logs (`readers/openai.py` builds the trace): one request per
line, as proxies and engines' request logging record them.

```
{"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
 "model": "...", "timestamp": "2025-01-01T12:00:00Z", "user": "u1",
 "response": {"choices": [{"message": {"content": "..."}}], "usage": {...}}}
```
The request may also sit under `request` or `body`. Each line is one LLM call: its input
is its messages rendered with a chat template (`templates.template_for`: a tokenizer
folder's own, else the piecewise one); its output is the logged reply, else the assistant
message the session's next request carries, else `usage.completion_tokens` pseudo-random
ids, else nothing.

Sessions: `session_field` (e.g. `user`, `metadata.session_id`) when given; otherwise a
request whose messages extend an earlier request's (with or without its reply) continues
that request's session. Arrivals: the first of `timestamp, created, created_at, time, ts`
(epoch seconds, milliseconds above 1e11, or ISO 8601), relative to the earliest; with no
timestamp at all, session i starts at i / sps and turns follow the typing model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl
from marconi.workload.options import TraceOptions
from marconi.workload.templates import message_text

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
TIME_KEYS = ("timestamp", "created", "created_at", "time", "ts")
_MS_ABOVE = 1e11  # an epoch number above this is in milliseconds (1e11 s is year 5138)


@dataclass(slots=True)
class Row:
    """One logged request."""

    line: int
    messages: list[dict[str, Any]]
    reply: str | None  # the logged answer, if any
    n_reply: int | None  # usage.completion_tokens, if logged
    time: float | None  # seconds since the epoch
    key: str | None = None  # session field value


def parse(path: Path, options: TraceOptions) -> list[Row]:
    rows = []
    for line, obj in iter_jsonl(path):
        body = _body(obj)
        if body is None:
            raise TraceError("missing field (a chat request has 'messages')", path=path,
                             line=line, field="messages")
        messages = [_message(m, path, line, i) for i, m in enumerate(_list(body, path, line))]
        row = Row(line, messages, _reply(obj), _usage(obj), _time(obj, body, path, line))
        if options.session_field:
            row.key = _session(obj, body, options.session_field, path, line)
        rows.append(row)
    return rows


def _body(obj: dict[str, Any]) -> dict[str, Any] | None:
    for candidate in (obj, obj.get("request"), obj.get("body")):
        if isinstance(candidate, dict) and "messages" in candidate:
            return candidate
    return None


def _list(body: dict[str, Any], path: Path, line: int) -> list[Any]:
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise TraceError("expected a non-empty list of messages", path=path, line=line,
                         field="messages")
    return messages


def _message(m: Any, path: Path, line: int, index: int) -> dict[str, Any]:
    role = m.get("role") if isinstance(m, dict) else None
    if role not in ROLES:
        raise TraceError(f"message {index}: unknown role {role!r}; known: {', '.join(ROLES)}",
                         path=path, line=line, field="role")
    content = m.get("content")
    if isinstance(content, list):  # parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    elif content is not None and not isinstance(content, str):
        raise TraceError(f"message {index}: expected text or a list of parts, got "
                         f"{type(content).__name__}", path=path, line=line, field="content")
    return {**m, "content": content or ""}


def _reply(obj: dict[str, Any]) -> str | None:
    response = obj.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(first, dict):
        message = first.get("message")
        if isinstance(message, dict) and message.get("tool_calls"):
            return message_text(message)  # tool calls, with or without text
        text = message.get("content") if isinstance(message, dict) else first.get("text")
        if isinstance(text, str):
            return text
    return obj.get("output") if isinstance(obj.get("output"), str) else None


def _usage(obj: dict[str, Any]) -> int | None:
    response = obj.get("response")
    usage = (response if isinstance(response, dict) else obj).get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _time(obj: dict[str, Any], body: dict[str, Any], path: Path, line: int) -> float | None:
    for where in (obj, body):
        for key in TIME_KEYS:
            if key in where:
                return _seconds(where[key], key, path, line)
    return None


def _seconds(value: Any, key: str, path: Path, line: int) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
        return value / 1000.0 if value > _MS_ABOVE else float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    raise TraceError(f"expected epoch seconds, milliseconds or an ISO 8601 time, got "
                     f"{value!r:.40}", path=path, line=line, field=key)


def _session(obj: dict[str, Any], body: dict[str, Any], dotted: str, path: Path,
             line: int) -> str:
    for where in (obj, body):
        value: Any = where
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, dict | list):
            return str(value)
    raise TraceError("missing session field (--session-field)", path=path, line=line,
                     field=dotted)


def digests(messages: list[dict[str, Any]]) -> list[bytes]:
    """A digest of each prefix of `messages` (equal prefixes, equal digests)."""
    h, out = hashlib.blake2b(digest_size=16), []
    for m in messages:
        key = [m.get("role"), m.get("content") or "", m.get("tool_calls") or None]
        h.update(json.dumps(key, sort_keys=True, default=str).encode() + b"\0")
        out.append(h.digest())
    return out
