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


def _plain_or_error(path: Path) -> object:
    """The reference reader's answer: its trace rows, or its error message."""
    from marconi.workload.buffers import TraceBuilder
    from marconi.workload.readers import artifact
    from marconi.workload.report import LoadStats

    builder = TraceBuilder()
    try:
        artifact._read_plain(path, builder, LoadStats(unit="requests"))
    except ValueError as err:
        return str(err)
    return _rows(builder.build(path.name).trace())


def _rows(trace: object) -> list[tuple[object, ...]]:
    return [(r.session_id, r.turn, r.arrival, r.input_tokens.tolist(), r.output_tokens.tolist())
            for r in trace]  # type: ignore[attr-defined]


def _loaded_or_error(path: Path) -> object:
    try:
        return _rows(load_trace(path, format="artifact", options=TraceOptions(use_cache=False)))
    except ValueError as err:
        return str(err)


GOOD = '{"session_id": "a", "turn_id": 0, "ts": 1, "input_tokens": [1, 2], "output_tokens": [3]}'


class TestFastPath:
    """msgspec + numpy read well-formed files; anything else goes to the plain reader, so
    the answer (trace or error message) is always the plain reader's."""

    def test_a_well_formed_file_takes_the_fast_path(self, tmp_path: Path) -> None:
        from tests.workload.test_pinned import artifact_file

        from marconi.workload.buffers import TraceBuilder
        from marconi.workload.io import read_bytes
        from marconi.workload.readers import artifact
        from marconi.workload.report import LoadStats

        path = artifact_file(tmp_path)  # CRLF, blank lines, spaces in lists, non-ASCII
        builder = TraceBuilder()
        assert artifact._read_fast(read_bytes(path), builder, LoadStats(unit="requests"))
        assert _rows(builder.build(path.name).trace()) == _plain_or_error(path)

    @pytest.mark.parametrize(
        "line",
        [
            GOOD.replace("[1, 2]", "[1.0, 2]"),
            GOOD.replace("[1, 2]", "[1e2]"),
            GOOD.replace("[1, 2]", "[-1, 2]"),
            GOOD.replace("[1, 2]", "[-0, 2]"),
            GOOD.replace("[1, 2]", "[2147483647]"),
            GOOD.replace("[1, 2]", "[2147483648]"),
            GOOD.replace("[1, 2]", "[18446744073709551617]"),
            GOOD.replace("[1, 2]", "[[1], [2]]"),
            GOOD.replace("[1, 2]", '["1"]'),
            GOOD.replace("[1, 2]", "[true]"),
            GOOD.replace("[1, 2]", "[01]"),
            GOOD.replace("[1, 2]", "[+1]"),
            GOOD.replace("[1, 2]", "[ ]"),
            GOOD.replace("[1, 2]", "{}"),
            GOOD.replace('"ts": 1', '"ts": NaN'),
            GOOD.replace('"ts": 1', '"ts": true'),
            GOOD.replace('"ts": 1', '"ts": 1e400'),
            GOOD.replace('"turn_id": 0', '"turn_id": 0.0'),
            GOOD.replace('"session_id": "a"', '"session_id": "\\ud800"'),
            GOOD.replace('"session_id": "a"', '"session_id": "a\u2028b"'),
            GOOD.replace('"session_id": "a"', '"session_id": "a\x0cb"'),
            GOOD.replace('"session_id": "a"', '"session_id": null'),
            GOOD + "\n\u3000\n" + GOOD,  # a blank line to str.strip, not to bytes.strip
            GOOD + "\r" + GOOD,  # a lone CR splits lines
            "\ufeff" + GOOD,
            GOOD + " x",
            "[1]",
        ],
    )
    def test_anything_else_reads_as_the_plain_reader_reads_it(
        self, tmp_path: Path, line: str
    ) -> None:
        path = tmp_path / "t.jsonl"
        path.write_bytes((GOOD + "\n" + line + "\n").encode("utf-8", "surrogatepass"))
        assert _loaded_or_error(path) == _plain_or_error(path)

    def test_invalid_utf8_is_named_as_before(self, tmp_path: Path) -> None:
        path = tmp_path / "t.jsonl"
        path.write_bytes(GOOD.encode() + b"\n" + GOOD.replace('"a"', '"\xff"').encode("latin-1"))
        with pytest.raises(TraceError, match=r"t.jsonl: not UTF-8 text at byte \d+"):
            load_trace(path, format="artifact")

    def test_the_warning_branch_of_older_numpy_reads_the_same(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from marconi.workload.readers import artifact

        monkeypatch.setattr(artifact, "_FROMSTRING_RAISES", False)
        path = tmp_path / "t.jsonl"
        for line in (GOOD, GOOD.replace("[1, 2]", "[1.5, 2]")):
            path.write_text(GOOD + "\n" + line + "\n")
            assert _loaded_or_error(path) == _plain_or_error(path)
