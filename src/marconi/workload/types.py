"""The two values every workload reader produces: `Request` and `Trace`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]


def as_tokens(values: object, *, what: str = "tokens") -> Tokens:
    """Return `values` as a 1-D int32 array, or raise ValueError naming `what`.

    Accepts sequences of Python ints and integer numpy arrays; refuses floats,
    bools, strings, nested lists and values outside int32.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a flat list of token ids, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu"):
        raise ValueError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{what}: token ids must be in [0, 2**31), got {arr.min()}..{arr.max()}")
    return np.ascontiguousarray(arr, dtype=np.int32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One LLM call: the input it prefills and the output it decodes.

    `input_tokens` and `output_tokens` are read-only int32 arrays; readers may hand out
    views into one buffer per session, so a conversation's history is stored once.
    """

    session_id: str  # requests of one conversation / agent run share it
    turn: int  # 0-based index of the call within its session
    arrival: float  # seconds since the trace start
    input_tokens: Tokens
    output_tokens: Tokens
    # message ends strictly inside the input (token offsets, ascending), where the reader
    # knows them: the end of a system prompt, of each user turn or tool observation
    boundaries: tuple[int, ...] = ()

    @property
    def n_input(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_output(self) -> int:
        return int(self.output_tokens.shape[0])

    def tokens(self) -> Tokens:
        """Input followed by output: what the cache commits after the request."""
        return np.concatenate([self.input_tokens, self.output_tokens])


@dataclass(frozen=True, slots=True)
class Trace(Sequence[Request]):
    """Requests in arrival order, with where they came from."""

    name: str
    requests: tuple[Request, ...]
    meta: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, i):
        return self.requests[i]

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @property
    def input_tokens(self) -> int:
        return sum(r.n_input for r in self.requests)

    @property
    def sessions(self) -> int:
        return len({r.session_id for r in self.requests})
