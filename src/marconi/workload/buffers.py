"""Compact trace storage: every request's tokens are views into one shared buffer.

A reader appends *buffers* (one per session where history is a prefix, e.g. a whole
conversation) and then requests as spans into them:

```
# session buffer: | sys | user0 | asst0 | user1 | asst1 | ...
# request 1 input: [0 ................... user1 end)
# request 1 output:                             [asst1)
```

`TraceArrays` is that layout flattened (one int32 array + offsets); it is also what the
disk cache stores, so a cached trace loads as one array and a few small ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from marconi.workload.report import META_KEY
from marconi.workload.types import Request, Tokens, Trace, as_tokens

Span = tuple[int, int]  # [start, stop) offsets into the flat token array


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceArrays:
    """A trace as flat arrays; `to_trace()` hands out views, never copies."""

    tokens: Tokens  # every buffer, concatenated
    spans: npt.NDArray[np.int64]  # (R, 4): input start, stop, output start, stop
    session_index: npt.NDArray[np.int64]  # (R,): index into session_names
    session_names: tuple[str, ...]
    turns: npt.NDArray[np.int64]  # (R,)
    arrivals: npt.NDArray[np.float64]  # (R,), seconds, ascending
    # message ends as offsets into `tokens`, ascending (empty: the reader knows none);
    # a request's `boundaries` are the marks strictly inside its input
    marks: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        r = self.turns.shape[0]
        if self.spans.shape != (r, 4) or self.session_index.shape != (r,):
            raise ValueError(f"TraceArrays: inconsistent shapes for {r} requests")
        if r and (self.spans.min() < 0 or self.spans.max() > self.tokens.shape[0]):
            raise ValueError("TraceArrays: a span points outside the token array")

    def to_trace(self, name: str, meta: dict[str, object] | None = None) -> Trace:
        """Requests as read-only views into `tokens`."""
        tokens = self.tokens.view()
        tokens.flags.writeable = False
        rows = zip(
            self.spans.tolist(),
            self.session_index.tolist(),
            self.turns.tolist(),
            self.arrivals.tolist(),
            strict=True,
        )
        requests = tuple(
            Request(
                session_id=self.session_names[s],
                turn=t,
                arrival=a,
                input_tokens=tokens[i0:i1],
                output_tokens=tokens[o0:o1],
                boundaries=self._boundaries(i0, i1),
                whole=tokens[i0:o1] if o0 == i1 else None,
            )
            for (i0, i1, o0, o1), s, t, a in rows
        )
        return Trace(name, requests, dict(meta or {}))


    def _boundaries(self, start: int, stop: int) -> tuple[int, ...]:
        """Marks strictly inside [start, stop), as offsets from `start`."""
        lo, hi = np.searchsorted(self.marks, [start + 1, stop])
        return tuple((self.marks[lo:hi] - start).tolist())


class TraceBuilder:
    """Collects buffers and request spans; `arrays()` sorts requests by arrival (stable)."""

    def __init__(self) -> None:
        self._buffers: list[Tokens] = []
        self._size = 0
        self._rows: list[tuple[int, int, int, int, int, int, float]] = []
        self._sessions: dict[str, int] = {}
        self._marks: list[int] = []
        self._adopted = False

    def adopt(self, tokens: Tokens) -> int:
        """`add_buffer` for an int32 array the caller hands over: when it is the only
        buffer, the trace holds it as it is (no copy)."""
        base = self.add_buffer(tokens)
        self._adopted = len(self._buffers) == 1
        return base

    def add_buffer(self, tokens: object) -> int:
        """Append a token buffer; returns its base offset for `add_request` spans."""
        arr = (
            tokens
            if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32
            else (as_tokens(tokens))
        )
        base = self._size
        self._buffers.append(arr)
        self._size += int(arr.shape[0])
        return base

    def add_marks(self, base: int, offsets: object) -> None:
        """Message ends at `offsets` (ascending) of the buffer that starts at `base`."""
        self._marks.extend(base + int(x) for x in np.asarray(offsets).tolist())

    def add_request(
        self, session_id: str, turn: int, arrival: float, input_span: Span, output_span: Span
    ) -> None:
        """Record one request whose input/output are `[start, stop)` of the flat array."""
        sid = self._sessions.setdefault(session_id, len(self._sessions))
        self._rows.append((*input_span, *output_span, sid, turn, float(arrival)))

    def __len__(self) -> int:
        return len(self._rows)

    def arrays(self) -> TraceArrays:
        rows = sorted(self._rows, key=lambda row: row[6])  # stable: ties keep insertion order
        table = np.array([row[:6] for row in rows], dtype=np.int64).reshape(len(rows), 6)
        if self._adopted and len(self._buffers) == 1:
            flat = self._buffers[0]
        else:
            flat = np.concatenate(self._buffers) if self._buffers else np.zeros(0, np.int32)
        return TraceArrays(
            tokens=flat.astype(np.int32, copy=False),
            spans=np.ascontiguousarray(table[:, :4]),
            session_index=np.ascontiguousarray(table[:, 4]),
            session_names=tuple(self._sessions),
            turns=np.ascontiguousarray(table[:, 5]),
            arrivals=np.array([row[6] for row in rows], dtype=np.float64),
            marks=np.unique(np.array(self._marks, dtype=np.int64)),
        )

    def build(self, name: str, meta: dict[str, object] | None = None) -> Built:
        """The trace, less the requests whose input is empty (a conversation that opens
        with an empty message: nothing to prefill, and no cache can look it up), counted
        in the load stats (`meta[META_KEY]["empty_inputs"]`) so the summary line names
        them; their sessions' later requests stay."""
        meta = dict(meta or {})
        empty = sum(1 for row in self._rows if row[0] == row[1])
        if empty:
            self._rows = [row for row in self._rows if row[0] != row[1]]
            load = meta.get(META_KEY)
            meta[META_KEY] = {**(load if isinstance(load, dict) else {"unit": "requests"}),
                              "empty_inputs": empty}
        return Built(self.arrays(), name, meta)


@dataclass(frozen=True, slots=True)
class Built:
    """A reader's result: the flat arrays (what the disk cache stores) and a name."""

    arrays: TraceArrays
    name: str
    meta: dict[str, object]

    def trace(self) -> Trace:
        return self.arrays.to_trace(self.name, self.meta)
