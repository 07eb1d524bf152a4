"""argparse flags for every `TraceOptions` knob, so any CLI command can expose them."""

from __future__ import annotations

import argparse

from marconi.workload.options import TraceOptions
from marconi.workload.registry import FORMATS
from marconi.workload.synthetic import parse_params
from marconi.workload.tokenizers import TOKENIZERS

_DEFAULTS = TraceOptions()


def _optional_int(text: str) -> int | None:
    """An integer, or `none`/`all` for no limit."""
    return None if text.lower() in ("none", "all", "off") else int(text)


def add_trace_arguments(parser: argparse.ArgumentParser, *, loading: bool = True) -> None:
    """Add a "trace" argument group (`--format`, `--tokenizer`, `--sessions`, ...).
    `loading=False` leaves out the flags about how, not what, to load (`--synthetic`, the
    trace cache): a sweep's cells carry only what shapes the trace."""
    g = parser.add_argument_group("trace")
    add = g.add_argument
    add(
        "--format",
        choices=sorted(FORMATS),
        default=None,
        help="trace format (inferred from the file when omitted)",
    )
    add(
        "--tokenizer",
        default=_DEFAULTS.tokenizer,
        help=f"{' | '.join(TOKENIZERS)} | a Hugging Face tokenizer folder (tokenizer.json + "
        "tokenizer_config.json: its chat template renders request logs) | a tokenizer.json "
        "or sentencepiece .model file",
    )
    add(
        "--sessions",
        type=_optional_int,
        default=_DEFAULTS.sessions,
        help="keep the first N eligible sessions ('all' for no limit; request-level "
        "formats such as Mooncake ignore it)",
    )
    add(
        "--min-turns",
        type=int,
        default=None,
        help="minimum rounds per session (default: 10 for ShareGPT and LMSys chats, 1 for "
        "agents and request logs)",
    )
    add(
        "--sps",
        type=float,
        default=_DEFAULTS.sessions_per_second,
        help="sessions per second (session i starts at i / sps)",
    )
    add(
        "--typing-wpm",
        type=float,
        default=_DEFAULTS.typing_wpm,
        help="chat: user typing speed in words per minute",
    )
    add(
        "--response-time",
        type=float,
        default=_DEFAULTS.response_time_s,
        help="chat: fixed model response time (s) before the user types",
    )
    add(
        "--mean-gap",
        type=float,
        default=_DEFAULTS.mean_gap_s,
        help="agents/synthetic: mean Poisson gap between calls (s)",
    )
    add(
        "--max-input-tokens",
        type=_optional_int,
        default=_DEFAULTS.max_input_tokens,
        help="drop requests with longer inputs, and later turns of their session ('none' "
        "keeps all)",
    )
    add(
        "--collapse-observations",
        type=_optional_int,
        default=None,
        metavar="K",
        help="SWE-agent: keep only the last K tool observations in full",
    )
    add(
        "--session-field",
        default=None,
        metavar="FIELD",
        help="request logs: the field naming each request's session (e.g. user, "
        "metadata.session_id); default: a request extending an earlier one's messages "
        "continues its session",
    )
    add("--seed", type=int, default=_DEFAULTS.seed, help="seed for every random choice")
    add(
        "--vocab-size",
        type=int,
        default=_DEFAULTS.vocab_size,
        help="vocabulary of pseudo-random token ids (Mooncake, synthetic)",
    )
    add("--block-size", type=int, default=_DEFAULTS.block_size, help="Mooncake: tokens per hash id")
    if not loading:
        return
    add("--synthetic", default="", metavar="K=V,...", help="synthetic generator parameters")
    add("--no-trace-cache", action="store_true", help="do not read or write the trace cache")
    add("--trace-cache-dir", default=None, help="trace cache directory ($MARCONI_CACHE_DIR)")


def options_from_args(args: argparse.Namespace) -> TraceOptions:
    """The `TraceOptions` the flags of `add_trace_arguments` describe (ValueError if bad)."""
    return TraceOptions(
        tokenizer=args.tokenizer,
        sessions=args.sessions,
        min_turns=args.min_turns,
        sessions_per_second=args.sps,
        typing_wpm=args.typing_wpm,
        response_time_s=args.response_time,
        mean_gap_s=args.mean_gap,
        max_input_tokens=args.max_input_tokens,
        collapse_observations=args.collapse_observations,
        seed=args.seed,
        vocab_size=args.vocab_size,
        block_size=args.block_size,
        session_field=args.session_field,
        params=parse_params(args.synthetic),
        use_cache=not args.no_trace_cache,
        cache_dir=args.trace_cache_dir,
    )
