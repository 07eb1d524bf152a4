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

import warnings
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl, lines, number, read_bytes, require, utf8
from marconi.workload.options import TraceOptions
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.types import Tokens, as_tokens

FIELDS = ("session_id", "turn_id", "ts", "input_tokens", "output_tokens")
_INT32_MAX = int(np.iinfo(np.int32).max)
_COMMA = ord(",")


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
    """Fill `builder` as `_read_plain` would; False (builder half filled) when not sure."""
    split = lines(data)
    if split is None:
        return False
    try:
        with warnings.catch_warnings():
            # numpy < 2.3 warns (later ones raise) when text is left unparsed
            warnings.simplefilter("error", DeprecationWarning)
            for line in split:
                try:
                    row = _decode_line(line)
                except (msgspec.DecodeError, RecursionError):
                    if bytes(line).strip():
                        return False
                    continue  # a blank line (only ASCII whitespace; others go plain)
                _add(builder, row)
                stats.read += 1
    except _NotSure:
        return False
    return True


def _add(builder: TraceBuilder, row: _Line) -> None:
    turn, ts = row.turn_id, row.ts
    if isinstance(turn, bool) or not isinstance(turn, int):
        raise _NotSure
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts != ts:
        raise _NotSure
    tokens_in, tokens_out = _ids(row.input_tokens), _ids(row.output_tokens)
    base_in = builder.add_buffer(tokens_in)
    base_out = builder.add_buffer(tokens_out)
    builder.add_request(
        str(row.session_id),
        turn,
        float(ts),
        (base_in, base_out),
        (base_out, base_out + tokens_out.shape[0]),
    )


def _ids(raw: msgspec.Raw) -> Tokens:
    """A JSON list of token ids (already valid JSON) as int32, parsed by numpy."""
    text = bytes(memoryview(raw))
    if text[:1] != b"[" or text[-1:] != b"]":
        raise _NotSure
    body = text[1:-1]
    if not body.strip():
        return np.zeros(0, np.int32)
    try:
        ids = np.fromstring(body, dtype=np.int64, sep=",")
    except (ValueError, DeprecationWarning):  # text numpy could not read to its end
        raise _NotSure from None
    # valid JSON read to its end, one number per comma: every element was an integer;
    # negative ones wrap above the int32 range as unsigned
    commas = int(np.count_nonzero(np.frombuffer(body, np.uint8) == _COMMA))
    if ids.shape[0] != commas + 1 or int(ids.view(np.uint64).max()) > _INT32_MAX:
        raise _NotSure
    return ids.astype(np.int32)
