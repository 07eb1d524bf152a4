"""Reading trace files: gzip by magic bytes, UTF-8 text, JSONL lines with numbers."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marconi.workload.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic (whatever its name)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise TraceError(f"cannot read: {err.strerror or err}", path=path) from err
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise TraceError(f"truncated or corrupt gzip file ({err})", path=path) from err


def read_text(path: str | Path) -> str:
    """The file as text (UTF-8, gzip transparent)."""
    try:
        return read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text at byte {err.start}", path=path) from err


def read_json(path: str | Path) -> Any:
    """One JSON document, with the line of any syntax error."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise TraceError(f"malformed JSON: {err.msg}", path=path, line=err.lineno) from err


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, object)` for each non-blank line; each line must be an object."""
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(f"malformed JSON line: {err.msg}", path=path, line=lineno) from err
        if not isinstance(obj, dict):
            raise TraceError("each line must be a JSON object", path=path, line=lineno)
        yield lineno, obj


def require(obj: dict[str, Any], key: str, *, path: str | Path, line: int | None = None) -> Any:
    """`obj[key]`, or a TraceError naming the missing field."""
    if key not in obj:
        raise TraceError("missing field", path=path, line=line, field=key)
    return obj[key]


def number(value: Any, key: str, *, path: str | Path, line: int | None = None) -> float:
    """`value` as a finite float (bools refused), or a TraceError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise TraceError(f"expected a number, got {value!r:.40}", path=path, line=line, field=key)
    return float(value)


def head_bytes(path: str | Path, n: int = 65536) -> bytes:
    """Up to the first `n` (decompressed) bytes, without reading the whole file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(n)
            if not raw.startswith(GZIP_MAGIC):
                return raw
        with gzip.open(path, "rb") as g:
            return g.read(n)
    except OSError as err:  # gzip.BadGzipFile is an OSError
        raise TraceError(f"cannot read: {err}", path=path) from err
    except EOFError as err:
        raise TraceError(f"truncated gzip file ({err})", path=path) from err
