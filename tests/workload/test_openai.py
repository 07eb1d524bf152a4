"""OpenAI chat request logs: inference, sessions by prefix or field, templates, times."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from marconi.cli import main
from marconi.workload import TraceOptions, infer_format, load_trace
from marconi.workload.templates import JinjaTemplate
from marconi.workload.tokenizers import chat_template, get_tokenizer

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(use_cache=False, tokenizer="mistral-v1")
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z in epoch seconds
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
          "{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["you", "are", "helpful", "hi", "hello", "there", "how", "fine", "thanks", "bye",
         "what", "is", "two", "plus", "four"]


def tokenizer_folder(root: Path, template: str | None = CHATML) -> Path:
    """A real Hugging Face tokenizer folder built in memory (WordLevel, no download)."""
    tokenizers = pytest.importorskip("tokenizers")
    specials = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>"]
    vocab = {w: i for i, w in enumerate([*specials, "\n", *dict.fromkeys(WORDS), "system",
                                         "user", "assistant"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config: dict[str, Any] = {"bos_token": "<s>", "eos_token": "<|im_end|>"}
    if template is not None:
        config["chat_template"] = template
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _log() -> list[dict[str, Any]]:
    """Two interleaved conversations (A: 3 turns, B: 2 turns), replies only in history."""
    sys = _msg("system", "you are helpful")
    a1, a2, a3 = _msg("user", "hi"), _msg("user", "how are you"), _msg("user", "bye")
    b1, b2 = _msg("user", "what is two plus two"), _msg("user", "thanks")
    ra1, ra2, rb1 = (_msg("assistant", t) for t in ("hello there", "fine thanks", "four"))
    return [{"messages": [sys, a1], "model": "m", "timestamp": T0 + 0.0},
            {"messages": [sys, b1], "model": "m", "timestamp": T0 + 1.0},
            {"messages": [sys, a1, ra1, a2], "model": "m", "timestamp": T0 + 4.5},
            {"messages": [sys, b1, rb1, b2], "model": "m", "timestamp": T0 + 6.0},
            {"messages": [sys, a1, ra1, a2, ra2, a3], "model": "m", "timestamp": T0 + 9.0}]


class TestOpenAILog:
    def test_inferred_as_a_request_log_not_a_trajectory(self, files: Files) -> None:
        path = files.jsonl("requests.jsonl", _log())
        assert infer_format(path) == "openai"
        assert len(load_trace(path, options=OPTS)) == 5

    def test_a_first_line_longer_than_the_sniffed_head_is_still_a_log(self,
                                                                       files: Files) -> None:
        log = _log()
        log[0]["messages"][0]["content"] = "you are helpful " * 8000  # ~130 KB
        path = files.jsonl("requests.jsonl", log)
        assert len(path.read_text().splitlines()[0]) > 65536
        assert infer_format(path) == "openai"
        assert len(load_trace(path, options=OPTS)) == 5

    def test_sessions_recovered_by_prefix(self, files: Files) -> None:
        trace = load_trace(files.jsonl("requests.jsonl", _log()), options=OPTS)
        sessions: dict[str, list[Any]] = {}
        for r in trace:
            sessions.setdefault(r.session_id, []).append(r)
        assert sorted(len(s) for s in sessions.values()) == [2, 3]
        for turns in sessions.values():
            assert [r.turn for r in turns] == list(range(len(turns)))
            for prev, nxt in itertools.pairwise(turns):
                assert prev.n_output > 0  # the reply the next request carries
                done = prev.tokens()  # prompt + reply is a prefix of the next prompt
                assert np.array_equal(nxt.input_tokens[: done.shape[0]], done)

    def test_session_field(self, files: Files) -> None:
        rows = [r | {"user": "u1" if i % 2 else "u0"} for i, r in enumerate(_log())]
        trace = load_trace(files.jsonl("r.jsonl", rows),
                           options=OPTS.with_(session_field="user"))
        assert sorted(r.session_id for r in trace) == ["u0", "u0", "u0", "u1", "u1"]
        with pytest.raises(ValueError, match=r"r.jsonl:1: field 'metadata.sid': missing"):
            load_trace(files.jsonl("r.jsonl", rows), format="openai",
                       options=OPTS.with_(session_field="metadata.sid"))

    @pytest.mark.parametrize("stamp", [
        lambda t: t, lambda t: int(t * 1000),
        lambda t: datetime.fromtimestamp(t, tz=UTC).isoformat()])
    def test_arrivals_from_timestamps(self, files: Files, stamp: Any) -> None:
        rows = [{**r, "timestamp": stamp(r["timestamp"])} for r in _log()]
        trace = load_trace(files.jsonl("r.jsonl", rows), options=OPTS)
        assert [r.arrival for r in trace] == pytest.approx([0.0, 1.0, 4.5, 6.0, 9.0])

    def test_without_timestamps_sessions_follow_sps(self, files: Files) -> None:
        rows = [{k: v for k, v in r.items() if k != "timestamp"} for r in _log()]
        trace = load_trace(files.jsonl("r.jsonl", rows), options=OPTS)
        firsts = sorted(r.arrival for r in trace if r.turn == 0)
        assert firsts == [0.0, 1.0]

    def test_tool_calls_are_rendered_and_replied(self, files: Files) -> None:
        """An assistant turn of tool calls alone: its calls are its text, in the next
        request's prompt and as the reply of the request that made them (logged or not)."""
        def log(argument: str, logged: bool) -> list[dict[str, Any]]:
            call = [{"id": "c1", "type": "function",
                     "function": {"name": "search", "arguments": json.dumps({"q": argument})}}]
            ask = [_msg("system", "you are helpful"), _msg("user", "what is two plus two")]
            made = {"role": "assistant", "content": None, "tool_calls": call}
            first: dict[str, Any] = {"messages": ask, "timestamp": T0}
            if logged:
                first["response"] = {"choices": [{"message": made}]}
            return [first, {"messages": [*ask, made, {"role": "tool", "content": "four",
                                                      "tool_call_id": "c1"}],
                            "timestamp": T0 + 5}]

        for logged in (True, False):
            short = load_trace(files.jsonl("a.jsonl", log("two", logged)), options=OPTS)
            long = load_trace(files.jsonl("b.jsonl", log("two plus two " * 20, logged)),
                              options=OPTS)
            assert len({r.session_id for r in short}) == 1  # the tool turn continues it
            assert short[0].n_output > 0 and long[0].n_output > short[0].n_output + 40
            assert long[1].n_input > short[1].n_input + 40
            second = short[1].input_tokens.tolist()
            assert second[: short[0].n_input + short[0].n_output] == short[0].tokens().tolist()

    def test_piecewise_template_by_default(self, files: Files) -> None:
        trace = load_trace(files.jsonl("r.jsonl", _log()[:1]), options=OPTS)
        first, tok = trace[0], get_tokenizer("mistral-v1")
        pieces = tok.encode_batch(["<|system|>", "you are helpful", "<|user|>", "hi",
                                   "<|assistant|>"])
        assert first.input_tokens.tolist() == [1, *np.concatenate(pieces).tolist()]  # <s>...
        ends = np.cumsum([1, *(p.shape[0] for p in pieces)])
        assert first.boundaries == (ends[2], ends[4])  # after each message's content

    def test_tokenizer_folder_renders_its_own_template(self, files: Files) -> None:
        folder = tokenizer_folder(files.root / "tok")
        trace = load_trace(files.jsonl("r.jsonl", _log()),
                           options=OPTS.with_(tokenizer=str(folder)))
        template = JinjaTemplate(folder, chat_template(folder) or "")
        text = template.text(_log()[0]["messages"], generation=True)
        assert text.startswith("<s><|im_start|>system\nyou are helpful<|im_end|>")
        ids = template.tokenizer.encode_batch([text])[0]
        assert trace.meta["template"].startswith("chat template of")
        first = next(r for r in trace if r.arrival == 0.0)
        assert np.array_equal(first.input_tokens, ids)
        assert 0 not in first.input_tokens.tolist()  # every word known: no <unk>

    def test_simulate_hits_on_a_log(self, files: Files, capsys: pytest.CaptureFixture) -> None:
        path = files.jsonl("r.jsonl", _log())
        assert main(["simulate", str(path), "--system", "sglang+", "--json", "--quiet",
                     "--no-trace-cache"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["requests"] == 5 and out["hit_tokens"] > 0

    @pytest.mark.parametrize(("row", "where"), [
        ({"messages": [{"role": "robot", "content": "x"}]}, r"r.jsonl:2: field 'role'"),
        ({"messages": "hi"}, r"r.jsonl:2: field 'messages'"),
        ({"messages": [_msg("user", "x")], "timestamp": "noon"}, r"r.jsonl:2: field 'timestamp'"),
        ({"messages": [_msg("user", "x")]}, r"r.jsonl:2: field 'timestamp': missing"),
    ])
    def test_bad_lines_name_line_and_field(self, files: Files, row: dict[str, Any],
                                           where: str) -> None:
        path = files.jsonl("r.jsonl", [_log()[0], row])
        with pytest.raises(ValueError, match=where):
            load_trace(path, format="openai", options=OPTS)
