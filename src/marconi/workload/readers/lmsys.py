"""LMSys-Chat-1M: its folder of parquet shards, one parquet file, a JSON array, or JSONL.

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
from marconi.workload.io import PARQUET_MAGIC, head_bytes, iter_jsonl
from marconi.workload.options import TraceOptions
from marconi.workload.readers.chat import build_chat_trace
from marconi.workload.readers.sharegpt import iter_objects

_ROLE = {**{r: r for r in ROLES}, "human": "user", "gpt": "assistant"}


def shards(folder: Path) -> list[Path]:
    """Every parquet shard under `folder` (LMSys-Chat-1M's layout: `data/*.parquet`), sorted."""
    return sorted(p for p in folder.rglob("*.parquet") if p.is_file())


def records(path: Path) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """`(line or None, record)` from a folder of parquet shards, parquet, a JSON array or
    JSONL; parquet is read a batch at a time, so selecting few sessions reads little."""
    if path.is_dir():
        for shard in shards(path):
            yield from _parquet(shard)
        return
    head = head_bytes(path, 4096)
    if head.startswith(PARQUET_MAGIC):
        yield from _parquet(path)
    elif head.lstrip().startswith(b"["):
        yield from ((None, obj) for obj in iter_objects(path))
    else:
        yield from iter_jsonl(path)


def _parquet(path: Path) -> Iterator[tuple[None, dict[str, Any]]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs the 'traces' extra (pyarrow not "
                         "installed): pip install 'marconi[traces]'") from None
    try:
        shard = pq.ParquetFile(path)
        names = set(shard.schema_arrow.names)
        columns = [c for c in ("conversation_id", "conversation") if c in names]
        for batch in shard.iter_batches(batch_size=1024, columns=columns):
            yield from ((None, row) for row in batch.to_pylist())
    except (OSError, pa.ArrowException) as err:
        raise TraceError(f"cannot read parquet: {err}", path=path) from None


def conversations(path: Path) -> Iterator[Conversation]:
    for index, (line, rec) in enumerate(records(path)):
        messages = rec.get("conversation") if isinstance(rec, dict) else None
        if not isinstance(messages, list | tuple):
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
