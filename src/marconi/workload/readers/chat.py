"""Shared pipeline of text formats: conversations -> selection -> tokens -> requests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.conversation import (
    OBSERVATION_NOTE,
    Arrivals,
    Conversation,
    add_collapsed,
    add_conversation,
    call_arrivals,
    select_sessions,
)
from marconi.workload.options import TraceOptions
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.tokenizers import encode_unique, get_tokenizer
from marconi.workload.types import Tokens

CHAT_MIN_TURNS = 10  # paper: sessions with >= 10 rounds


def build_trace(
    source: str | Path,
    convs: Iterable[Conversation],
    options: TraceOptions,
    *,
    kind: Arrivals,
    min_turns: int,
    rounds: Callable[[Conversation], int],
    fmt: str,
    unit: str = "conversations",
) -> Built:
    """Select sessions, tokenize every message once, and lay requests out per session."""
    stats = LoadStats(unit=unit, max_input_tokens=options.max_input_tokens)
    chosen = select_sessions(convs, options, min_turns=min_turns, rounds=rounds, stats=stats)
    tokenizer = get_tokenizer(options.tokenizer)
    flat = encode_unique(tokenizer, [t for c in chosen for t in c.texts] + [OBSERVATION_NOTE])
    builder, start = TraceBuilder(), 0
    for index, conv in enumerate(chosen):
        tokens = flat[start : start + len(conv.texts)]
        start += len(conv.texts)
        added = _add(
            builder, conv, tokens, call_arrivals(conv, index, options, kind), options, note=flat[-1]
        )
        stats.long_requests += len(conv.calls) - added  # cut at its first over-long input
        stats.long_sessions += added < len(conv.calls)
    meta = {
        "format": fmt,
        "source": str(source),
        "tokenizer": tokenizer.name,
        "sessions_truncated": stats.long_sessions,
        META_KEY: stats.as_meta(),
    }
    return builder.build(Path(source).name, meta)


def build_chat_trace(source: str | Path, convs: Iterable[Conversation], options: TraceOptions,
                     fmt: str) -> Built:
    """`build_trace` for chat formats: typing-time arrivals, sessions of >= 10 rounds
    unless the options say otherwise."""
    return build_trace(source, convs, options, kind=Arrivals.TYPING,
                       min_turns=options.min_turns_or(CHAT_MIN_TURNS),
                       rounds=lambda c: c.rounds, fmt=fmt)


def _add(
    builder: TraceBuilder,
    conv: Conversation,
    tokens: list[Tokens],
    arrivals: list[float],
    options: TraceOptions,
    *,
    note: Tokens,
) -> int:
    """One session, as prefix views or (collapsing observations) one buffer per call."""
    if options.collapse_observations is None:
        return add_conversation(builder, conv, tokens, arrivals, options.max_input_tokens)
    return add_collapsed(
        builder,
        conv,
        tokens,
        arrivals,
        options.max_input_tokens,
        options.collapse_observations,
        note,
    )
