"""JSONL reading: a line that is not an object is named, on both line readers (the fast
one over byte views, and the plain one for text with other line breaks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl, read_json


@pytest.mark.parametrize("breaks", ["\n", "\u2028"])  # U+2028: the plain reader
def test_a_line_that_is_not_an_object_is_named(tmp_path: Path, breaks: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n[1, 2]\n'.replace("\n", breaks, 1), encoding="utf-8")
    with pytest.raises(TraceError, match=r"t\.jsonl:3: each line must be a JSON object"):
        list(iter_jsonl(path))


def test_objects_come_with_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n{"b": 2}\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, {"b": 2})]


@pytest.mark.parametrize("breaks", ["\n", "\u2028"])
def test_a_cut_line_is_named_with_its_column(tmp_path: Path, breaks: str) -> None:
    """A file cut mid-string (`head -c`): the message ends with where, not mid-sentence."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}' + breaks + '{"text": "hel', encoding="utf-8")
    with pytest.raises(TraceError) as err:
        list(iter_jsonl(path))
    assert str(err.value).endswith(
        "t.jsonl:2: malformed JSON line: Unterminated string starting at column 10")


def test_a_malformed_document_is_named_with_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"a": 1,\n "b": 2} x\n', encoding="utf-8")
    with pytest.raises(TraceError) as err:
        read_json(path)
    assert str(err.value) == f"{path}:2: malformed JSON: Extra data at column 10"
