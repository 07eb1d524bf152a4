"""LMSys-Chat-1M from a local file: parquet, a JSON array, or JSONL.

Each record has `conversation: [{"role", "content"}...]` and usually `conversation_id`.
Same chat recipe as ShareGPT (rounds = messages // 2, typing-time arrivals).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marconi.workload.buffers import Built
from marconi.workload.conversation import ROLES, Conversation
from marconi.workload.errors import TraceError
from marconi.workload.io import head_bytes, iter_jsonl
from marconi.workload.options import TraceOptions
from marconi.workload.readers.chat import build_chat_trace
from marconi.workload.readers.sharegpt import iter_objects

PARQUET_MAGIC = b"PAR1"
_ROLE = {**{r: r for r in ROLES}, "human": "user", "gpt": "assistant"}


def records(path: Path) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """`(line or None, record)` from parquet, a JSON array or JSONL."""
    head = head_bytes(path, 4096)
    if head.startswith(PARQUET_MAGIC):
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=None)
        yield from ((None, row) for row in table.to_pylist())
    elif head.lstrip().startswith(b"["):
        yield from ((None, obj) for obj in iter_objects(path))
    else:
        yield from iter_jsonl(path)


def conversations(path: Path) -> Iterator[Conversation]:
    for index, (line, rec) in enumerate(records(path)):
        messages = rec.get("conversation") if isinstance(rec, dict) else None
        if not isinstance(messages, list):
            raise TraceError(
                f"record {index}: missing or not a list", path=path, line=line, field="conversation"
            )
        sid = str(rec.get("conversation_id") or index)
        roles, texts = [], []
        for m in messages:
            role = m.get("role") if isinstance(m, dict) else None
            if role not in _ROLE:
                raise TraceError(
                    f"record {index}: unknown role {role!r}", path=path, line=line, field="role"
                )
            roles.append(_ROLE[str(role)])
            texts.append(str(m.get("content") or ""))
        yield Conversation(sid, tuple(roles), tuple(texts))


def read(source: str | Path, options: TraceOptions) -> Built:
    path = Path(source)
    return build_chat_trace(path, conversations(path), options, fmt="lmsys")
