from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceOptions, infer_format, load_trace
from marconi.workload.pseudo import pseudo_tokens

if TYPE_CHECKING:
    from tests.workload.conftest import Files

ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1300, "output_length": 7, "hash_ids": [0, 1, 2]},
    {"timestamp": 2000, "input_length": 600, "output_length": 3, "hash_ids": [0, 9]},
]


class TestMooncake:
    @pytest.mark.parametrize("gz", [False, True])
    def test_hash_blocks_are_deterministic_and_shared(self, files: Files, gz: bool) -> None:
        path = files.jsonl("mc.jsonl", ROWS, gz=gz)
        assert infer_format(path) == "mooncake"
        a, b, c = load_trace(path)
        assert [r.arrival for r in (a, b, c)] == [0.0, 1.5, 2.0]
        assert [r.n_input for r in (a, b, c)] == [1000, 1300, 600]
        assert [r.n_output for r in (a, b, c)] == [5, 7, 3]
        assert np.array_equal(a.input_tokens[:512], pseudo_tokens(0, 512, vocab=32000))
        assert np.array_equal(a.input_tokens, b.input_tokens[:1000])  # shared blocks 0, 1
        assert np.array_equal(c.input_tokens[:512], a.input_tokens[:512])
        assert not np.array_equal(c.input_tokens[512:600], a.input_tokens[512:600])
        assert len({a.session_id, b.session_id, c.session_id}) == 3
        assert np.shares_memory(a.input_tokens, b.input_tokens)  # a's ids prefix b's

    def test_seed_changes_blocks_and_drop_long(self, files: Files) -> None:
        path = files.jsonl("mc.jsonl", ROWS)
        one = load_trace(path, options=TraceOptions(seed=1))
        assert not np.array_equal(one[0].input_tokens, load_trace(path)[0].input_tokens)
        short = load_trace(path, options=TraceOptions(max_input_tokens=1000))
        assert [r.n_input for r in short] == [1000, 600]
        assert short.meta["dropped_long"] == 1

    @pytest.mark.parametrize(
        ("row", "field"),
        [
            ({"timestamp": 0, "input_length": 10, "output_length": 1}, "hash_ids"),
            (
                {"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": [0]},
                "input_length",
            ),
            (
                {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]},
                "hash_ids",
            ),
            (
                {"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": ["a"]},
                "hash_ids",
            ),
        ],
    )
    def test_bad_rows(self, files: Files, row: dict[str, object], field: str) -> None:
        path = files.jsonl("mc.jsonl", [ROWS[0], row])
        with pytest.raises(ValueError, match=rf"mc.jsonl:2: field '{field}'"):
            load_trace(path, format="mooncake")

    def test_real_conversation_trace(self, data_dir: Path) -> None:
        trace = load_trace(data_dir / "mooncake" / "synthetic_trace.jsonl")
        assert 3000 < len(trace) <= 3993
        assert max(r.n_input for r in trace) <= 32768
        assert trace[0].input_tokens.base is trace[-1].input_tokens.base


GOOD = '{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}'


class TestFastPath:
    """msgspec reads well-formed rows; anything else goes to the plain reader, so the
    answer (rows or error message) is always the plain reader's."""

    @pytest.mark.parametrize(
        "line",
        [
            GOOD,
            GOOD.replace('"timestamp": 5', '"timestamp": 5.5, "extra": [1, {"a": null}]'),
            GOOD.replace('"timestamp": 5', '"timestamp": true'),
            GOOD.replace('"timestamp": 5', '"timestamp": NaN'),
            GOOD.replace('"timestamp": 5', '"timestamp": 1e400'),
            GOOD.replace('"input_length": 600', '"input_length": 600.0'),
            GOOD.replace('"input_length": 600', '"input_length": -1'),
            GOOD.replace('"input_length": 600', '"input_length": false'),
            GOOD.replace("[0, 1]", "[0, true]"),
            GOOD.replace("[0, 1]", "[0, -1]"),
            GOOD.replace("[0, 1]", "[0, 1.0]"),
            GOOD.replace("[0, 1]", "{}"),
            GOOD.replace('"output_length": 2, ', ""),
            GOOD + ' {"x": 1}',
            "\u3000",
            GOOD + "\r\n" + GOOD,
            GOOD + "\r" + GOOD,
            "[1]",
        ],
    )
    def test_rows_are_the_plain_readers(self, tmp_path: Path, line: str) -> None:
        from marconi.workload.readers import mooncake

        path = tmp_path / "mc.jsonl"
        path.write_text(GOOD + "\n\n" + line + "\n", encoding="utf-8")

        def rows(parse: object) -> object:
            try:
                return [(r.line, r.arrival, r.input_length, r.output_length, r.hash_ids)
                        for r in parse(path)]  # type: ignore[operator]
            except ValueError as err:
                return str(err)

        assert rows(mooncake._parse) == rows(mooncake._parse_plain)

    def test_a_well_formed_file_takes_the_fast_path(self, files: Files) -> None:
        from marconi.workload.io import lines, read_bytes
        from marconi.workload.readers import mooncake

        path = files.jsonl("mc.jsonl", ROWS)
        split = lines(read_bytes(path))
        assert split is not None and mooncake._parse_fast(split) is not None
