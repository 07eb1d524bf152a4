"""`TraceOptions`: every knob a reader or generator takes, in one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

DEFAULT_TOKENIZER = "mistral-v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """How to turn a source (file or generator) into a `Trace`.

    Defaults follow the paper's recipe (docs/architecture.md, "Workloads"). Knobs a format does not
    use are ignored by it (e.g. the artifact JSONL is read unchanged).
    """

    # Text -> token ids: a registry name (see `tokenizers.TOKENIZERS`) or a local path to a
    # tokenizer.json / sentencepiece .model. Only text formats use it.
    tokenizer: str = DEFAULT_TOKENIZER
    # Keep the first N sessions that pass `min_turns` (paper: 100); None keeps all.
    # Request-level formats (artifact JSONL, Mooncake) ignore it.
    sessions: int | None = 100
    # Keep sessions with at least this many rounds (messages // 2 for chat; calls for
    # agents). None = the format's default: 10 for chat (paper), 1 otherwise.
    min_turns: int | None = None
    # Session i starts at i / sessions_per_second (paper default 1.0).
    sessions_per_second: float = 1.0
    # Chat: the user types the next message at this speed before it is sent (paper: 90).
    typing_wpm: float = 90.0
    # Chat: fixed model response time added between a turn and the next typed message.
    response_time_s: float = 0.0
    # Agents and synthetic sessions: mean of the exponential (Poisson) gap between calls.
    mean_gap_s: float = 5.0
    # Requests whose input is longer are dropped with every later turn of their session
    # (history only grows); None keeps everything. Paper: 32K.
    max_input_tokens: int | None = 32768
    # SWE-agent style: keep the last k tool observations in full, replace older ones with a
    # short fixed note. None replays histories unchanged.
    collapse_observations: int | None = None
    # Seeds every random choice (arrival gaps, synthetic content, pseudo-random tokens).
    seed: int = 0
    # Pseudo-random token ids (Mooncake blocks, synthetic) are drawn from [3, vocab_size).
    vocab_size: int = 32000
    # Mooncake: tokens per hash id block.
    block_size: int = 512
    # Request logs (OpenAI format): the field naming each request's session (dotted, e.g.
    # `user` or `metadata.session_id`); None recovers sessions by message prefix.
    session_field: str | None = None
    # Synthetic generators: parameters (also settable as `synthetic:NAME:k=v,k=v`).
    params: Mapping[str, str] = field(default_factory=dict)
    # Reuse / store tokenized traces on disk (see `diskcache`). None = MARCONI_CACHE_DIR or
    # ~/.cache/marconi/traces.
    use_cache: bool = True
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        _positive(self, "sessions_per_second", "typing_wpm", "mean_gap_s", "block_size")
        _non_negative(self, "response_time_s", "seed")
        _optional_positive(self, "sessions", "max_input_tokens")
        _optional_non_negative(self, "min_turns", "collapse_observations")
        if self.vocab_size < 4:
            raise ValueError(f"vocab_size must be >= 4, got {self.vocab_size}")
        if not self.tokenizer:
            raise ValueError("tokenizer must be a registry name or a path")
        object.__setattr__(self, "params", dict(self.params))

    def with_(self, **changes: Any) -> TraceOptions:
        """A copy with `changes` applied (validated again)."""
        return replace(self, **changes)

    def min_turns_or(self, default: int) -> int:
        return default if self.min_turns is None else self.min_turns

    def key(self) -> dict[str, object]:
        """The fields that shape a trace's content, for cache keys (not where it is cached)."""
        skip = {"use_cache", "cache_dir"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["params"] = sorted(self.params.items())
        return out


def _positive(opts: TraceOptions, *names: str) -> None:
    for name in names:
        if not getattr(opts, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(opts, name)!r}")


def _non_negative(opts: TraceOptions, *names: str) -> None:
    for name in names:
        if not getattr(opts, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(opts, name)!r}")


def _optional_positive(opts: TraceOptions, *names: str) -> None:
    for name in names:
        if getattr(opts, name) is not None:
            _positive(opts, name)


def _optional_non_negative(opts: TraceOptions, *names: str) -> None:
    for name in names:
        if getattr(opts, name) is not None:
            _non_negative(opts, name)
