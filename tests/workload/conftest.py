"""Shared helpers: tiny trace files in tmp_path, the real data folder, an isolated cache."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"  # CI checks the data out next to the repository


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test caches traces in its own folder, never in ~/.cache."""
    cache = tmp_path / "trace-cache"
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"real trace data not found at {DATA}")
    return DATA


class Files:
    """Writes small trace files into a test's tmp_path (optionally gzipped)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def text(self, name: str, text: str, *, gz: bool = False) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if gz:
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path

    def jsonl(self, name: str, rows: Sequence[object], *, gz: bool = False) -> Path:
        return self.text(name, "".join(json.dumps(r) + "\n" for r in rows), gz=gz)

    def json(self, name: str, doc: object, *, gz: bool = False) -> Path:
        return self.text(name, json.dumps(doc), gz=gz)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)
