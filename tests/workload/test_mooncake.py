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
