"""Reading trace files: gzip by magic bytes, UTF-8 text, JSONL lines with numbers.

JSON is decoded by msgspec (C, several hundred MB/s); whatever msgspec refuses goes back
to Python's `json` module, which decides (and words any error), so a file reads exactly as
`json` reads it: same values, same lines, same messages. `lines` splits a file's bytes
the way `str.splitlines` would split its text, or says it cannot.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from marconi.workload.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"  # the first (and last) bytes of a parquet file
# line breaks of `str.splitlines` other than "\n" (and "\r\n", handled on its own)
_ODD_BREAKS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_ODD_UTF8_BREAKS = tuple(c.encode() for c in ("\x85", "\u2028", "\u2029"))
_DECODE = msgspec.json.Decoder().decode


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


def utf8(data: bytes, path: str | Path) -> bytes:
    """`data`, or the TraceError `read_text` gives when it is not UTF-8."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"not UTF-8 text at byte {err.start}", path=path) from err
    return data


def loads(data: str | bytes | memoryview | msgspec.Raw) -> Any:
    """`json.loads(data)`, faster: msgspec decodes, `json` decides whatever it refuses
    (NaN, numbers beyond a double, lone surrogates, deep nesting) and words the errors."""
    try:
        return _DECODE(data)
    except (msgspec.DecodeError, RecursionError):
        return json.loads(data if isinstance(data, str) else bytes(memoryview(data)))


def read_json(path: str | Path) -> Any:
    """One JSON document, with the line of any syntax error."""
    data = utf8(read_bytes(path), path)
    try:
        return _DECODE(data)
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        return json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise TraceError(f"malformed JSON: {json_reason(err)}", path=path,
                         line=err.lineno) from err


def json_reason(err: json.JSONDecodeError) -> str:
    """`json`'s message with its column, the line going before it in the TraceError
    (`err.msg` alone stops mid-sentence: "Unterminated string starting at")."""
    joint = " " if err.msg.endswith(" at") else " at "
    return f"{err.msg}{joint}column {err.colno}"


def lines(data: bytes, *, views: bool = True) -> Iterable[memoryview | bytes] | None:
    """The lines of UTF-8 `data`, numbered as `data.decode().splitlines()` numbers them:
    views into `data` (no copy), or with `views=False` a list of bytes (faster per line,
    for files of many short lines); None when the text holds a line break other than
    "\n" and "\r\n" (the caller then splits the decoded text)."""
    if any(b in data for b in _ODD_BREAKS):
        return None
    if not data.isascii() and any(b in data for b in _ODD_UTF8_BREAKS):
        return None
    crlf = b"\r" in data
    if crlf and data.count(b"\r") != data.count(b"\r\n"):
        return None
    if views:
        return _split(memoryview(data), crlf)
    split = data.split(b"\n")
    if split and not split[-1]:
        split.pop()  # the final newline ends the last line; it starts none
    return [line.removesuffix(b"\r") for line in split] if crlf else split


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (parsing makes many objects and no cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _split(view: memoryview, crlf: bool) -> Iterator[memoryview]:
    data, start, end = view.obj, 0, len(view)
    assert isinstance(data, bytes)
    while start < end:
        stop = data.find(b"\n", start)
        stop = end if stop < 0 else stop
        cut = stop - 1 if crlf and stop > start and data[stop - 1] == 0x0D else stop
        yield view[start:cut]
        start = stop + 1


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, object)` for each non-blank line; each line must be an object."""
    data = utf8(read_bytes(path), path)
    split = lines(data)
    if split is None:
        yield from _iter_text(data.decode("utf-8"), path)
        return
    for lineno, line in enumerate(split, start=1):
        try:
            obj = _DECODE(line)
        except (msgspec.DecodeError, RecursionError):
            text = bytes(line).decode("utf-8")
            if not text.strip():
                continue
            obj = _json_line(text, path, lineno)
        yield lineno, _an_object(obj, path, lineno)


def _iter_text(text: str, path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        yield lineno, _an_object(_json_line(line, path, lineno), path, lineno)


def _an_object(obj: Any, path: str | Path, lineno: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TraceError("each line must be a JSON object", path=path, line=lineno)
    return obj


def _json_line(line: str, path: str | Path, lineno: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"malformed JSON line: {json_reason(err)}", path=path,
                         line=lineno) from err


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


def first_line(path: str | Path, limit: int = 64 << 20) -> bytes:
    """The first non-blank line (decompressed), read up to its end however long it is,
    up to `limit` bytes."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        opened = gzip.open(path, "rb") if gzipped else open(path, "rb")  # noqa: SIM115
        with opened as f:
            text = b""
            while len(text) < limit:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                text = (text + chunk).lstrip()
                if b"\n" in text:
                    break
        return text.split(b"\n", 1)[0]
    except OSError as err:
        raise TraceError(f"cannot read: {err}", path=path) from err
    except EOFError as err:
        raise TraceError(f"truncated gzip file ({err})", path=path) from err


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
