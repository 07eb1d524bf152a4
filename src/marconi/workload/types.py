"""The two values every workload reader produces: `Request` and `Trace`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from marconi.core.tokens import Tokens, as_tokens

__all__ = ["Request", "Tokens", "Trace", "as_tokens"]


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
    # input then output as one view, where a reader holds them side by side in one buffer
    # (`TraceArrays.to_trace`); None: `tokens()` concatenates them
    whole: Tokens | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        whole = self.whole
        if whole is not None and whole.shape[0] != self.n_input + self.n_output:
            raise ValueError(f"Request {self.session_id!r} turn {self.turn}: `whole` holds "
                             f"{whole.shape[0]} tokens, input and output "
                             f"{self.n_input + self.n_output} (replace all three together)")

    @property
    def n_input(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_output(self) -> int:
        return int(self.output_tokens.shape[0])

    def tokens(self) -> Tokens:
        """Input followed by output: what the cache commits after the request (a view,
        read-only, where the reader holds them side by side)."""
        if self.whole is not None:
            return self.whole
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
