"""A sweep's results file: one row per cell, CSV or Parquet, never left half written.

Every write goes to a temporary file beside the target, is flushed to disk, and then
replaces the target with `os.replace` (atomic on POSIX). A process killed at any point
leaves either the previous complete file or the new one, plus at worst a stray
`.tmp` file that the next write overwrites.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

TEXT_COLUMNS = frozenset({"cell_id", "status", "error", "dataset", "trace", "system",
                          "capacity", "model", "tokenizer", "objective"})
SUFFIXES = (".csv", ".parquet")


class ResultsFile:
    """Rows (dicts) stored at `path`; the format follows the extension."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.suffix not in SUFFIXES:
            raise ValueError(f"results file {self.path} must end in .csv or .parquet")

    def read(self) -> list[dict[str, Any]]:
        """Every stored row; [] when the file does not exist yet."""
        if not self.path.exists():
            return []
        if self.path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return [_clean(row) for row in pq.read_table(self.path).to_pylist()]
        with self.path.open(newline="") as f:
            return [{k: _parse(k, v) for k, v in row.items()} for row in csv.DictReader(f)]

    def write(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file's content with `rows`, atomically."""
        rows = list(rows)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".parquet":
            _write_parquet(tmp, rows, columns)
        else:
            _write_csv(tmp, rows, columns)
        os.replace(tmp, self.path)


def _write_csv(tmp: Path, rows: list[Mapping[str, Any]], columns: list[str]) -> None:
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _text(v) for k, v in row.items()})
        f.flush()
        os.fsync(f.fileno())


def _write_parquet(tmp: Path, rows: list[Mapping[str, Any]], columns: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: pa.array([_plain(row.get(c)) for row in rows]) for c in columns})
    pq.write_table(table, tmp)
    with tmp.open("rb") as f:
        os.fsync(f.fileno())


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _text(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _parse(column: str, text: str | None) -> Any:
    """CSV text back to None, bool, int, float or str (ids and names stay text)."""
    if text is None or text == "":
        return "" if column in TEXT_COLUMNS else None
    if column in TEXT_COLUMNS:
        return text
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _clean(row: Mapping[str, Any]) -> dict[str, Any]:
    """Parquet rows: NaN from all-null float columns stays None."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
