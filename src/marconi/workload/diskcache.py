"""Loaded traces on disk, so a rerun neither parses nor tokenizes again (every format
read from a file; `registry.load_trace` decides).

Files live in `$MARCONI_CACHE_DIR` (default `~/.cache/marconi/traces`), one `.npz` per
(source files' path/size/mtime, format, options, tokenizer), named by its hash. Writes are
atomic (temporary file + rename); an unreadable or corrupt file is ignored and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from marconi.workload.buffers import Built, TraceArrays
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace

# bump when a reader's output or the file's layout changes (2: marks; 3: session names in
# the JSON header, where numpy's fixed-width strings no longer drop a trailing NUL)
CACHE_VERSION = 3
ENV_VAR = "MARCONI_CACHE_DIR"


def cache_dir(options: TraceOptions) -> Path:
    if options.cache_dir is not None:
        return Path(options.cache_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marconi" / "traces"


def cache_key(fmt: str, files: Iterable[Path], options: TraceOptions, tokenizer_id: str) -> str:
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    blob = json.dumps([CACHE_VERSION, fmt, stats, options.key(), tokenizer_id], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load(path: Path) -> Trace | None:
    """The cached trace, or None when absent, unreadable or corrupt."""
    try:
        with np.load(path, allow_pickle=False) as z:
            name, meta, names = json.loads(str(z["info"]))
            arrays = TraceArrays(
                tokens=z["tokens"],
                spans=z["spans"],
                session_index=z["session_index"],
                session_names=tuple(names),
                turns=z["turns"],
                arrivals=z["arrivals"],
                marks=z["marks"],
            )
    except Exception:  # any damage means "rebuild": the cache is never the source of truth
        return None
    return arrays.to_trace(name, {**meta, "cache": str(path)})


def save(path: Path, built: Built) -> None:
    """Write atomically: readers see the old file or the whole new one."""
    arrays, name, meta = built.arrays, built.name, built.meta
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f,
                tokens=arrays.tokens,
                spans=arrays.spans,
                session_index=arrays.session_index,
                turns=arrays.turns,
                arrivals=arrays.arrivals,
                marks=arrays.marks,
                info=np.array(json.dumps([name, meta, arrays.session_names], default=str)),
            )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached(path: Path, build: Callable[[], Built]) -> Trace:
    """Load `path`, or build, store and return the trace."""
    hit = load(path)
    if hit is not None:
        return hit
    built = build()
    with contextlib.suppress(OSError):  # a read-only cache dir must not break loading
        save(path, built)
    return built.trace()
