"""Loaded traces on disk, so a rerun neither parses nor tokenizes again (every format
read from a file; `registry.load_trace` decides).

Files live in `$MARCONI_CACHE_DIR` (default `~/.cache/marconi/traces`), one `.trace` per
(source files' path/size/mtime, format, options, tokenizer), named by its hash: a JSON
header and the flat arrays, mapped into memory on load (no copy, no parse). Writes are
atomic (temporary file + rename); an unreadable or corrupt file is ignored and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from marconi.workload.buffers import Built, TraceArrays
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace

# bump when a reader's output or the file's layout changes (2: marks; 3: one file mapped
# into memory, session names in its JSON header, where numpy's fixed-width strings no
# longer drop a trailing NUL; 4: OpenAI logs render tool calls)
CACHE_VERSION = 5  # 5: requests with an empty input dropped (counted)
ENV_VAR = "MARCONI_CACHE_DIR"
SUFFIX = ".trace"
# the file: MAGIC, the header's length (8 bytes, little-endian), the JSON header [name,
# meta, session names, {array: [dtype, rows, columns, offset]}], then from the next
# multiple of _ALIGN each array's bytes at its offset (each a multiple of _ALIGN)
MAGIC = b"MARCONI-TRACE-3\n"
_ALIGN = 64
_ARRAYS = ("tokens", "spans", "session_index", "turns", "arrivals", "marks")


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
    """The cached trace, or None when absent, unreadable or corrupt. The arrays are
    read-only views of the file mapped into memory: nothing is copied, and pages are read
    as the replay reaches them."""
    try:
        with path.open("rb") as f:
            view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if view[: len(MAGIC)] != MAGIC:
            return None
        (size,) = struct.unpack_from("<Q", view, len(MAGIC))
        top = len(MAGIC) + 8
        name, meta, names, layout = json.loads(view[top : top + size].decode("utf-8"))
        start = _aligned(top + size)
        arrays = {key: _array(view, start, *spec) for key, spec in layout.items()}
        trace_arrays = TraceArrays(session_names=tuple(names), **arrays)
    except Exception:  # any damage means "rebuild": the cache is never the source of truth
        return None
    return trace_arrays.to_trace(name, {**meta, "cache": str(path)})


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _array(view: mmap.mmap, start: int, dtype: str, rows: int, columns: int,
           offset: int) -> npt.NDArray[Any]:
    count = rows * columns
    if start + offset + count * np.dtype(dtype).itemsize > len(view):
        raise ValueError("cache file cut short")
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=start + offset)
    return flat.reshape(rows, columns) if columns > 1 else flat


def save(path: Path, built: Built) -> None:
    """Write atomically: readers see the old file or the whole new one."""
    arrays, name, meta = built.arrays, built.name, built.meta
    columns = {key: np.ascontiguousarray(getattr(arrays, key)) for key in _ARRAYS}
    layout, offset = {}, 0
    for key, values in columns.items():
        width = values.shape[1] if values.ndim > 1 else 1
        layout[key] = [values.dtype.str, values.shape[0], width, offset]
        offset += _aligned(values.nbytes)
    header = json.dumps([name, meta, arrays.session_names, layout], default=str).encode()
    start = _aligned(len(MAGIC) + 8 + len(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for key, values in columns.items():
                f.seek(start + layout[key][3])
                f.write(values.tobytes() if values.nbytes < 1 << 20 else values.data.cast("B"))
            f.truncate(start + offset)
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
