"""Conversations (chat or agent) -> requests: the paper's recipe, shared by text readers.

Every assistant message that has at least one message before it is one LLM call: its
input is all earlier messages (each tokenized separately, no chat template), its output
is that assistant message. So request k+1's input starts with request k's input+output,
and a session's requests are views into one buffer holding the conversation once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from marconi.workload.buffers import TraceBuilder
from marconi.workload.options import TraceOptions
from marconi.workload.report import LoadStats
from marconi.workload.types import Tokens

ROLES = ("system", "user", "assistant", "tool")
OBSERVATION_NOTE = "Old environment output omitted."  # SWE-agent's collapsed observation


@dataclass(frozen=True, slots=True)
class Conversation:
    """One session's messages, roles normalized to `ROLES`."""

    session_id: str
    roles: tuple[str, ...]
    texts: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.roles) != len(self.texts):
            raise ValueError(f"{self.session_id}: {len(self.roles)} roles, {len(self.texts)} texts")
        bad = set(self.roles) - set(ROLES)
        if bad:
            raise ValueError(f"{self.session_id}: unknown roles {sorted(bad)}")

    @property
    def calls(self) -> list[int]:
        """Indices of the messages that are LLM outputs (one request each)."""
        return [i for i, role in enumerate(self.roles) if role == "assistant" and i > 0]

    @property
    def rounds(self) -> int:
        """Chat rounds as ShareGPT counts them (message pairs)."""
        return len(self.texts) // 2

    def observations(self) -> list[int]:
        """Tool outputs: user/tool messages after the first call."""
        calls = self.calls
        first = calls[0] if calls else len(self.roles)
        return [i for i in range(first, len(self.roles)) if self.roles[i] in ("user", "tool")]


class Arrivals(enum.Enum):
    """How calls of a session are spaced in time (session i starts at i / sps)."""

    TYPING = "typing"  # chat: response time + typing time of the next user message
    POISSON = "poisson"  # agents: exponential gaps of mean `mean_gap`


def select_sessions(
    convs: Iterable[Conversation],
    opts: TraceOptions,
    *,
    min_turns: int,
    rounds: Callable[[Conversation], int],
    stats: LoadStats,
) -> list[Conversation]:
    """The first `opts.sessions` conversations with a call and `rounds(c) >= min_turns`.

    The source is read lazily and no further than the limit; `stats` counts what was read
    and what each filter dropped (and whether reading stopped at the limit).
    """
    stats.min_turns, stats.sessions = min_turns, opts.sessions
    kept: list[Conversation] = []
    for conv in convs:
        if opts.sessions is not None and len(kept) == opts.sessions:
            stats.stopped = True  # at least one more conversation was there, unread
            break
        stats.read += 1
        if not conv.calls:
            stats.no_call += 1
        elif rounds(conv) < min_turns:
            stats.short += 1
        else:
            kept.append(conv)
    return kept


def call_arrivals(
    conv: Conversation, index: int, opts: TraceOptions, kind: Arrivals
) -> list[float]:
    """Arrival time of each call of `conv`, the `index`-th selected session."""
    start = index / opts.sps
    calls = conv.calls
    if kind is Arrivals.POISSON:
        rng = np.random.default_rng([opts.seed, index])
        gaps = rng.exponential(opts.mean_gap, size=max(len(calls) - 1, 0))
        return [start, *(start + np.cumsum(gaps)).tolist()]
    times = [start]
    for call in calls[1:]:
        words = len(conv.texts[call - 1].split())  # the user message that triggers the call
        times.append(times[-1] + opts.response_time + 60.0 * words / opts.typing_wpm)
    return times


def add_conversation(
    builder: TraceBuilder,
    conv: Conversation,
    tokens: Sequence[Tokens],
    arrivals: Sequence[float],
    max_input: int | None,
) -> int:
    """Add `conv`'s calls as views into one buffer; stops at the first over-long input.

    Returns the number of requests added.
    """
    ends = np.cumsum([0, *(t.shape[0] for t in tokens)]).tolist()
    base = builder.add_buffer(np.concatenate(tokens) if tokens else np.zeros(0, np.int32))
    builder.add_marks(base, ends[1:-1])  # message ends: the system prompt's, each turn's
    for turn, (call, arrival) in enumerate(zip(conv.calls, arrivals, strict=True)):
        if max_input is not None and ends[call] > max_input:
            return turn
        builder.add_request(
            conv.session_id,
            turn,
            arrival,
            (base, base + ends[call]),
            (base + ends[call], base + ends[call + 1]),
        )
    return len(conv.calls)


def add_collapsed(
    builder: TraceBuilder,
    conv: Conversation,
    tokens: Sequence[Tokens],
    arrivals: Sequence[float],
    max_input: int | None,
    keep: int,
    note: Tokens,
) -> int:
    """Like `add_conversation`, but observations older than the last `keep` are `note`.

    Histories are no longer prefixes of each other, so each call gets its own buffer.
    """
    observations = conv.observations()
    for turn, (call, arrival) in enumerate(zip(conv.calls, arrivals, strict=True)):
        seen = [i for i in observations if i < call]
        old = set(seen[: max(len(seen) - keep, 0)])
        parts = [note if i in old else tokens[i] for i in range(call)]
        n_in = sum(p.shape[0] for p in parts)
        if max_input is not None and n_in > max_input:
            return turn
        base = builder.add_buffer(np.concatenate([*parts, tokens[call]]))
        builder.add_marks(base, np.cumsum([p.shape[0] for p in parts])[:-1])
        n_out = tokens[call].shape[0]
        builder.add_request(
            conv.session_id, turn, arrival, (base, base + n_in), (base + n_in, base + n_in + n_out)
        )
    return len(conv.calls)
