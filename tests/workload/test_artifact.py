from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceError, TraceOptions, infer_format, load_trace

if TYPE_CHECKING:
    from tests.workload.conftest import Files

ROWS = [
    {
        "session_id": "b",
        "turn_id": 0,
        "ts": 2.0,
        "input_tokens": [5, 6],
        "output_tokens": [7],
        "extra": "ignored",
    },
    {"session_id": "a", "turn_id": 0, "ts": 1.0, "input_tokens": [1, 2, 3], "output_tokens": [4]},
    {
        "session_id": "a",
        "turn_id": 1,
        "ts": 3.0,
        "input_tokens": [1, 2, 3, 4, 9],
        "output_tokens": [],
    },
]


class TestArtifact:
    @pytest.mark.parametrize("gz", [False, True])
    def test_read_unchanged_sorted_by_ts(self, files: Files, gz: bool) -> None:
        path = files.jsonl("trace.jsonl", ROWS, gz=gz)
        trace = load_trace(path, options=TraceOptions())
        assert [r.arrival for r in trace] == [1.0, 2.0, 3.0]
        assert [(r.session_id, r.turn) for r in trace] == [("a", 0), ("b", 0), ("a", 1)]
        assert trace[2].input_tokens.tolist() == [1, 2, 3, 4, 9]
        assert trace[1].output_tokens.tolist() == [7]
        assert trace[2].n_output == 0
        assert trace[0].input_tokens.dtype == np.int32

    def test_inferred_from_content_even_gzipped_without_extension(self, files: Files) -> None:
        path = files.jsonl("blob", ROWS, gz=True)
        assert infer_format(path) == "artifact"

    def test_tokens_are_read_only(self, files: Files) -> None:
        trace = load_trace(files.jsonl("t.jsonl", ROWS))
        with pytest.raises(ValueError):
            trace[0].input_tokens[0] = 99

    @pytest.mark.parametrize("format", [None, "artifact"])
    def test_empty_file_is_an_error(self, tmp_path: Path, format: str | None) -> None:
        path = tmp_path / "empty.jsonl"
        path.write_text("\n")
        with pytest.raises(ValueError, match=r"empty.jsonl: no requests to replay: .*empty|"
                                             r"empty.jsonl: no requests to replay: it holds no"):
            load_trace(path, format=format)

    @pytest.mark.parametrize(
        ("line", "field", "reason"),
        [
            (
                '{"session_id": "a", "turn_id": 0, "ts": 1, "input_tokens": [1]}',
                "output_tokens",
                "missing field",
            ),
            (
                '{"session_id": "a", "turn_id": 0, "ts": 1, "input_tokens": [1, 2.5], '
                '"output_tokens": []}',
                "input_tokens",
                "integers",
            ),
            (
                '{"session_id": "a", "turn_id": 0, "ts": 1, "input_tokens": ["x"], '
                '"output_tokens": []}',
                "input_tokens",
                "integers",
            ),
            (
                '{"session_id": "a", "turn_id": 0, "ts": "soon", "input_tokens": [1], '
                '"output_tokens": []}',
                "ts",
                "number",
            ),
            (
                '{"session_id": "a", "turn_id": 1.5, "ts": 1, "input_tokens": [1], '
                '"output_tokens": []}',
                "turn_id",
                "integer",
            ),
        ],
    )
    def test_bad_field_names_file_line_field(
        self, files: Files, line: str, field: str, reason: str
    ) -> None:
        path = files.text("bad.jsonl", json.dumps(ROWS[1]) + "\n" + line + "\n")
        with pytest.raises(TraceError) as err:
            load_trace(path, format="artifact")
        assert (err.value.line, err.value.field) == (2, field)
        assert "bad.jsonl:2" in str(err.value) and f"'{field}'" in str(err.value)
        assert reason in str(err.value)

    def test_malformed_line(self, files: Files) -> None:
        rows = "".join(json.dumps(r) + "\n" for r in ROWS)
        path = files.text("bad.jsonl", rows + '{"session_id": \n')
        with pytest.raises(ValueError, match=r"bad.jsonl:4: malformed JSON"):
            load_trace(path)
