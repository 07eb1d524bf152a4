"""The Marconi paper artifact's JSONL traces, read unchanged (token ids, no tokenizer).

One object per line: `session_id, turn_id, ts, input_tokens, output_tokens` (extra keys
ignored). Requests are sorted by `ts` (stable), each keeps its own buffer.
"""

from __future__ import annotations

from pathlib import Path

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl, number, require
from marconi.workload.options import TraceOptions
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.types import as_tokens

FIELDS = ("session_id", "turn_id", "ts", "input_tokens", "output_tokens")


def read(source: str | Path, options: TraceOptions) -> Built:
    builder, stats = TraceBuilder(), LoadStats(unit="requests")
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
    meta: dict[str, object] = {"format": "artifact", "source": str(source),
                               META_KEY: stats.as_meta()}
    return builder.build(Path(source).name, meta)


def _tokens(values: dict[str, object], key: str, source: str | Path, lineno: int) -> object:
    try:
        return as_tokens(values[key], what=key)
    except ValueError as err:
        raise TraceError(str(err).split(": ", 1)[-1], path=source, line=lineno, field=key) from err
