"""Mooncake hash-id traces (`{"timestamp" ms, "input_length", "output_length", "hash_ids"}`).

Each hash id names one `block_size`-token block (512 in Mooncake): it becomes a fixed
pseudo-random block, a pure function of (id, seed), so equal ids give equal tokens and
prefix sharing survives. The last block is cut to `input_length`. Outputs are
pseudo-random per request. There is no session id: each request is its own session
(`mc<line>`); reuse shows through shared hash-id prefixes only.

Memory: a request whose id list is a prefix of another's is a view into that one's
buffer (in lexicographic order, a prefix sits right before a list that extends it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated

import msgspec

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.errors import TraceError
from marconi.workload.io import (
    gc_paused,
    iter_jsonl,
    lines,
    number,
    read_bytes,
    require,
    utf8,
)
from marconi.workload.options import TraceOptions
from marconi.workload.pseudo import block_tokens, pseudo_tokens
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.types import Tokens

_OUTPUT_SALT = 0x6F7574  # keeps output ids apart from block ids


class _Row(msgspec.Struct, gc=False):
    """One line: its JSON fields (decoded by msgspec against these types; anything it
    refuses goes to the plain reader) and its line number. Untracked by the cyclic
    garbage collector: a million rows are never scanned."""

    timestamp: int | float  # milliseconds
    input_length: Annotated[int, msgspec.Meta(ge=0)]
    output_length: Annotated[int, msgspec.Meta(ge=0)]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...]
    line: int = 0  # set after decoding: not a JSON field

    @property
    def arrival(self) -> float:
        return float(self.timestamp) / 1000.0


def _parse(source: str | Path) -> list[_Row]:
    """The rows, read by msgspec against `_Row`; any line it refuses sends the file to the
    plain reader (`json` per line), which decides and words the error. Call it with the
    cyclic garbage collector paused (`gc_paused`) until the rows are dropped: they hold a
    tuple per line that a collection would otherwise walk, and make no cycle."""
    data = utf8(read_bytes(source), source)
    split = lines(data, views=False)
    rows = None if split is None else _parse_fast(split)
    return _parse_plain(source) if rows is None else rows


_decode_line = msgspec.json.Decoder(_Row).decode


def _parse_fast(split: list[bytes] | Iterable[memoryview | bytes]) -> list[_Row] | None:
    try:  # every line a row: one map in C, then the line numbers
        rows = list(map(_decode_line, split))
    except (msgspec.DecodeError, RecursionError):
        return _parse_lines(split)
    for line, row in enumerate(rows, start=1):
        row.line = line
    return rows


def _parse_lines(split: Iterable[memoryview | bytes]) -> list[_Row] | None:
    """Line by line: blank lines (ASCII whitespace only; others go plain) are skipped."""
    rows: list[_Row] = []
    append = rows.append
    for line, text in enumerate(split, start=1):
        try:
            row = _decode_line(text)
        except (msgspec.DecodeError, RecursionError):
            if bytes(text).strip():
                return None
            continue
        row.line = line
        append(row)
    return rows


def _parse_plain(source: str | Path) -> list[_Row]:
    rows = []
    for line, obj in iter_jsonl(source):

        def get(key: str, obj: dict[str, object] = obj, line: int = line) -> object:
            return require(obj, key, path=source, line=line)

        ts_ms = number(get("timestamp"), "timestamp", path=source, line=line)
        n_in, n_out = (_count(get(k), k, source, line) for k in ("input_length", "output_length"))
        ids = get("hash_ids")
        if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
            raise TraceError(
                "expected a list of integer ids", path=source, line=line, field="hash_ids"
            )
        rows.append(_Row(ts_ms, n_in, n_out, tuple(ids), line))
    return rows


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(value: object, key: str, source: str | Path, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(
            f"expected a non-negative integer, got {value!r:.40}", path=source, line=line, field=key
        )
    return value


def _blocks(ids: tuple[int, ...], opts: TraceOptions) -> Tokens:
    return block_tokens(ids, opts.block_size, vocab=opts.vocab_size, salt=opts.seed)


def read(source: str | Path, options: TraceOptions) -> Built:
    with gc_paused():  # the rows are dropped inside (see `_parse`)
        return _read(source, options)


def _read(source: str | Path, options: TraceOptions) -> Built:
    rows = _parse(source)
    for row in rows:
        if row.input_length > len(row.hash_ids) * options.block_size:
            raise TraceError(
                f"input_length {row.input_length} exceeds {len(row.hash_ids)} blocks of "
                f"{options.block_size}",
                path=source,
                line=row.line,
                field="hash_ids",
            )
    limit = options.max_input_tokens
    kept = [r for r in rows if limit is None or r.input_length <= limit]
    builder, bases = TraceBuilder(), _input_buffers(kept, options)
    for row in kept:
        out = builder.add_buffer(
            pseudo_tokens(row.line, row.output_length, vocab=options.vocab_size,
                          salt=options.seed ^ _OUTPUT_SALT)
        )
        base = bases(builder, row.hash_ids)
        builder.add_marks(base, range(options.block_size, row.input_length, options.block_size))
        builder.add_request(
            f"mc{row.line}", 0, row.arrival, (base, base + row.input_length),
            (out, out + row.output_length)
        )
    stats = LoadStats(unit="requests", read=len(rows), max_input_tokens=limit,
                      long_requests=len(rows) - len(kept))
    meta = {"format": "mooncake", "source": str(source), "dropped_long": stats.long_requests,
            META_KEY: stats.as_meta()}
    return builder.build(Path(source).name, meta)


def _input_buffers(
    rows: list[_Row], opts: TraceOptions
) -> Callable[[TraceBuilder, tuple[int, ...]], int]:
    """`base(builder, ids)`: offset of a buffer starting with the blocks of `ids`.

    Each id list is served by the longest list it is a prefix of, materialized once.
    """
    unique = sorted({r.hash_ids for r in rows})
    owner: dict[tuple[int, ...], tuple[int, ...]] = {}
    for i in range(len(unique) - 1, -1, -1):
        nxt = unique[i + 1] if i + 1 < len(unique) else None
        extends = nxt is not None and nxt[: len(unique[i])] == unique[i]
        owner[unique[i]] = owner[nxt] if extends and nxt is not None else unique[i]
    made: dict[tuple[int, ...], int] = {}

    def base(builder: TraceBuilder, ids: tuple[int, ...]) -> int:
        longest = owner[ids]
        if longest not in made:
            made[longest] = builder.add_buffer(_blocks(longest, opts))
        return made[longest]

    return base
