"""`TraceOptions`: every knob a reader or generator takes, in one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from marconi.settings import check_all, declared, setting
from marconi.workload.tokenizers import TOKENIZERS

DEFAULT_TOKENIZER = "mistral-v1"
ALL_WORDS = ("none", "all", "off")  # what a limit says for no limit


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """How to turn a source (file or generator) into a `Trace`.

    Every field but the last three is a run setting (`marconi.settings`): its flag, sweep
    axis and API keyword carry its name. Defaults follow the paper's recipe
    (docs/architecture.md, "Workloads"). Knobs a format does not use are ignored by it
    (e.g. the artifact JSONL is read unchanged).
    """

    tokenizer: str = setting(
        DEFAULT_TOKENIZER, f"text formats: {' | '.join(TOKENIZERS)} | a Hugging Face "
        "tokenizer folder (tokenizer.json + tokenizer_config.json: its chat template "
        "renders request logs) | a tokenizer.json or sentencepiece .model file")
    sessions: int | None = setting(
        100, "keep the first N eligible sessions ('all' for no limit; request-level "
        "formats such as Mooncake ignore it)", positive=True, none_words=ALL_WORDS)
    min_turns: int | None = setting(
        None, "minimum rounds per session (default: 10 for ShareGPT and LMSys chats, 1 "
        "for agents and request logs)", minimum=0)
    sps: float = setting(1.0, "sessions per second (session i starts at i / sps)",
                         positive=True)
    typing_wpm: float = setting(90.0, "chat: user typing speed in words per minute",
                                positive=True)
    response_time: float = setting(
        0.0, "chat: fixed model response time (s) before the user types", minimum=0)
    mean_gap: float = setting(5.0, "agents/synthetic: mean Poisson gap between calls (s)",
                              positive=True)
    max_input_tokens: int | None = setting(
        32768, "drop requests with longer inputs, and later turns of their session "
        "('none' keeps all; the paper: 32K)", positive=True, none_words=ALL_WORDS)
    collapse_observations: int | None = setting(
        None, "SWE-agent: keep only the last K tool observations in full, older ones "
        "replaced by a short fixed note", minimum=0, metavar="K")
    seed: int = setting(0, "seed for every random choice (arrival gaps, synthetic "
                           "content, pseudo-random tokens)", minimum=0)
    vocab_size: int = setting(32000, "vocabulary of pseudo-random token ids (Mooncake, "
                                     "synthetic): drawn from [3, vocab_size)", minimum=4)
    block_size: int = setting(512, "Mooncake: tokens per hash id", positive=True)
    session_field: str | None = setting(
        None, "request logs: the field naming each request's session (e.g. user, "
        "metadata.session_id); default: a request extending an earlier one's messages "
        "continues its session", metavar="FIELD")
    # How, not what, to load: synthetic generators' parameters (also settable as
    # `synthetic:NAME:k=v,k=v`), and whether and where tokenized traces are cached on disk
    # (`diskcache`; None: MARCONI_CACHE_DIR or ~/.cache/marconi/traces).
    params: Mapping[str, str] = field(default_factory=dict)
    use_cache: bool = True
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        check_all(self, TRACE_SETTINGS)
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


TRACE_SETTINGS = declared(TraceOptions)  # what shapes a trace, as run settings
