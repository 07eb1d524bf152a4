"""The one error type readers raise for bad input: a ValueError that says where."""

from __future__ import annotations

from os import PathLike


class TraceError(ValueError):
    """Bad trace input, located by file, line (JSONL, 1-based) and field when known.

    `str(err)` reads like a compiler message: ``trace.jsonl:12: field 'ts': not a number``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | PathLike[str] | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.reason = message
        super().__init__(_render(self.path, line, field, message))


def _render(path: str | None, line: int | None, field: str | None, message: str) -> str:
    where = path or "<trace>"
    if line is not None:
        where += f":{line}"
    if field is not None:
        where += f": field '{field}'"
    return f"{where}: {message}"
