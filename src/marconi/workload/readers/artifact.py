"""The Marconi paper artifact's JSONL traces, read unchanged (token ids, no tokenizer).

One object per line: `session_id, turn_id, ts, input_tokens, output_tokens` (extra keys
ignored). Requests are sorted by `ts` (stable), each keeps its own buffer.

Speed: msgspec decodes each line, leaving the two token lists as raw JSON text, and numpy
parses that text straight into an array (no Python object per token). Anything the fast
path is not sure of (a float, a negative or too large id, a missing field, a line
msgspec refuses) sends the whole file to the plain reader (`json`, one line at a time),
which decides and words the error: both give the same trace, and the same errors.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl, lines, number, read_bytes, require, utf8
from marconi.workload.options import TraceOptions
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.types import Tokens, as_tokens

FIELDS = ("session_id", "turn_id", "ts", "input_tokens", "output_tokens")
_INT32_MAX = int(np.iinfo(np.int32).max)
_FROMSTRING_RAISES = np.lib.NumpyVersion(np.__version__) >= "2.3.0"
_COMMA, _OPEN, _CLOSE = ord(","), ord("["), ord("]")


def read(source: str | Path, options: TraceOptions) -> Built:
    data = utf8(read_bytes(source), source)
    builder, stats = TraceBuilder(), LoadStats(unit="requests")
    fast = _read_fast(data, builder, stats)
    del data  # the arrays are built from the parsed buffers alone
    if not fast:
        builder, stats = TraceBuilder(), LoadStats(unit="requests")
        _read_plain(source, builder, stats)
    meta: dict[str, object] = {"format": "artifact", "source": str(source),
                               META_KEY: stats.as_meta()}
    return builder.build(Path(source).name, meta)


def _read_plain(source: str | Path, builder: TraceBuilder, stats: LoadStats) -> None:
    """The reference reader: `json` per line, every check with its message."""
    for lineno, obj in iter_jsonl(source):
        stats.read += 1
        values = {key: require(obj, key, path=source, line=lineno) for key in FIELDS}
        turn = values["turn_id"]
        if isinstance(turn, bool) or not isinstance(turn, int):
            raise TraceError(
                f"expected an integer, got {turn!r:.40}", path=source, line=lineno, field="turn_id"
            )
        ts = number(values["ts"], "ts", path=source, line=lineno)
        base_in = builder.add_buffer(_tokens(values, "input_tokens", source, lineno))
        base_out = builder.add_buffer(_tokens(values, "output_tokens", source, lineno))
        n_in, n_out = base_out - base_in, len(values["output_tokens"])
        builder.add_request(
            str(values["session_id"]),
            turn,
            ts,
            (base_in, base_in + n_in),
            (base_out, base_out + n_out),
        )


def _tokens(values: dict[str, object], key: str, source: str | Path, lineno: int) -> object:
    try:
        return as_tokens(values[key], what=key)
    except ValueError as err:
        raise TraceError(str(err).split(": ", 1)[-1], path=source, line=lineno, field=key) from err


class _Line(msgspec.Struct):
    """One line as the fast path takes it: token lists left as JSON text."""

    session_id: Any
    turn_id: Any
    ts: Any
    input_tokens: msgspec.Raw
    output_tokens: msgspec.Raw


class _NotSure(Exception):
    """The fast path cannot vouch for this input: the plain reader decides."""


_decode_line = msgspec.json.Decoder(_Line).decode


def _read_fast(data: bytes, builder: TraceBuilder, stats: LoadStats) -> bool:
    """Fill `builder` as `_read_plain` would (the same flat layout: each line's input, then
    its output, in file order); False, with `builder` untouched, when not sure."""
    split = lines(data)
    if split is None:
        return False
    # a list of k ids spans at least 2k - 1 bytes plus its brackets: the ids fit in half
    # as many int32 as the file has bytes (pages never written are never allocated)
    flat = _Flat(np.empty(len(data) // 2 + 1, np.int32))
    rows: list[tuple[str, int, float, int, int, int]] = []
    try:
        with _unparsed_text_raises():
            for line in split:
                try:
                    row = _decode_line(line)
                except (msgspec.DecodeError, RecursionError):
                    if bytes(line).strip():
                        return False
                    continue  # a blank line (only ASCII whitespace; others go plain)
                rows.append(_row(flat, row))
    except _NotSure:
        return False
    base = builder.adopt(flat.buffer[: flat.size])
    for sid, turn, ts, start_in, start_out, stop_out in rows:
        builder.add_request(sid, turn, ts, (base + start_in, base + start_out),
                            (base + start_out, base + stop_out))
    stats.read += len(rows)
    return True


@contextlib.contextmanager
def _unparsed_text_raises() -> Iterator[None]:
    """numpy >= 2.3 raises when `fromstring` leaves text unparsed; older ones warn, and
    the warning is made an error here (the filters are process-wide: only when needed)."""
    if _FROMSTRING_RAISES:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


class _Flat:
    """Token ids appended into one preallocated int32 buffer."""

    def __init__(self, buffer: Tokens) -> None:
        self.buffer, self.size = buffer, 0

    def put(self, raw: msgspec.Raw) -> int:
        """Append the ids of a JSON list; returns where they start."""
        ids, start = _ids(raw), self.size
        self.buffer[start : start + ids.shape[0]] = ids
        self.size += ids.shape[0]
        return start


def _row(flat: _Flat, row: _Line) -> tuple[str, int, float, int, int, int]:
    turn, ts = row.turn_id, row.ts
    if isinstance(turn, bool) or not isinstance(turn, int):
        raise _NotSure
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts != ts:
        raise _NotSure
    start_in, start_out = flat.put(row.input_tokens), flat.put(row.output_tokens)
    return str(row.session_id), turn, float(ts), start_in, start_out, flat.size


def _ids(raw: msgspec.Raw) -> npt.NDArray[np.int64]:
    """A JSON list of token ids (already valid JSON) as int64 in the int32 range, parsed
    by numpy."""
    view = memoryview(raw)
    if len(view) < 2 or view[0] != _OPEN or view[-1] != _CLOSE:
        raise _NotSure
    body = bytes(view[1:-1])
    if not body.strip():
        return np.zeros(0, np.int64)
    try:
        ids = np.fromstring(body, dtype=np.int64, sep=",")
    except (ValueError, DeprecationWarning):  # text numpy could not read to its end
        raise _NotSure from None
    # valid JSON read to its end, one number per comma: every element was an integer;
    # negative ones wrap above the int32 range as unsigned
    commas = int(np.count_nonzero(np.frombuffer(body, np.uint8) == _COMMA))
    if ids.shape[0] != commas + 1 or int(ids.view(np.uint64).max()) > _INT32_MAX:
        raise _NotSure
    return ids
