"""mini-swe-agent / SWE-agent trajectories: one session per trajectory file.

mini-swe-agent writes `{"messages": [{"role", "content"}...], "instance_id", ...}`;
SWE-agent writes `{"history": [...]}`. Content is a string or a list of `{"text"}`
parts. Every assistant message is one call whose input is all earlier messages; calls
are spaced by Poisson gaps. `collapse_observations=k` replays SWE-agent's history
processor: only the last k tool observations stay in full.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marconi.workload.buffers import Built
from marconi.workload.conversation import ROLES, Arrivals, Conversation
from marconi.workload.errors import TraceError
from marconi.workload.io import read_json
from marconi.workload.options import TraceOptions
from marconi.workload.readers.chat import build_trace

SUFFIXES = (".traj.json", ".traj")


def is_trajectory(path: Path) -> bool:
    return path.name.endswith(SUFFIXES) or path.name.endswith(tuple(s + ".gz" for s in SUFFIXES))


def trajectory_files(source: str | Path) -> list[Path]:
    """The trajectory file itself, or every trajectory under a directory (sorted)."""
    path = Path(source)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TraceError("no such file or directory", path=path)
    return sorted(p for p in path.rglob("*") if p.is_file() and is_trajectory(p))


def conversations(source: str | Path) -> Iterator[Conversation]:
    for path in trajectory_files(source):
        doc = read_json(path)
        messages = _messages(doc, path)
        sid = str(doc.get("instance_id") or path.name.split(".")[0])
        roles = tuple(_role(m, path, i) for i, m in enumerate(messages))
        texts = tuple(_text(m.get("content"), path, i) for i, m in enumerate(messages))
        yield Conversation(sid, roles, texts)


def _messages(doc: Any, path: Path) -> list[dict[str, Any]]:
    key = next((k for k in ("messages", "history") if isinstance(doc, dict) and k in doc), None)
    if key is None:
        raise TraceError(
            "missing field (a trajectory has 'messages' or 'history')", path=path, field="messages"
        )
    messages = doc[key]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TraceError("expected a list of message objects", path=path, field=key)
    return messages


def _role(message: dict[str, Any], path: Path, index: int) -> str:
    role = message.get("role")
    if role not in ROLES:
        raise TraceError(f"message {index}: unknown role {role!r}", path=path, field="role")
    return str(role)


def _text(content: object, path: Path, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    if content is None:
        return ""
    raise TraceError(
        f"message {index}: expected text, got {type(content).__name__}", path=path, field="content"
    )


def read(source: str | Path, options: TraceOptions) -> Built:
    return build_trace(
        source,
        conversations(source),
        options,
        kind=Arrivals.POISSON,
        min_turns=options.min_turns_or(1),
        rounds=lambda c: len(c.calls),
        fmt="swe-agent",
        unit="trajectories",
    )
