"""JSONL reading: a line that is not an object is named, on both line readers (the fast
one over byte views, and the plain one for text with other line breaks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.workload.errors import TraceError
from marconi.workload.io import iter_jsonl


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
