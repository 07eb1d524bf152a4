"""Bad requests get OpenAI-style 4xx bodies naming the field; the server keeps serving, on
the same connection too."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from marconi.engines.hf import HybridModel
from marconi.server import build_backend, create_app
from marconi.server.config import ServerConfig
from tests.server.harness import Served, post, run_app, scrape, serve

BRANCH_NAMES = (".str", "list[", "Value error", "function-", "int]")  # pydantic internals


@pytest.fixture(scope="module")
def shared(model: HybridModel) -> Iterator[Served]:
    """One server for the cases that only need a 4xx and one good request after it."""
    with serve(model, capacity="64MB", max_tokens=2) as served:
        yield served


def _chat(server: Served, **fields: Any) -> str:
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2} | fields
    return json.dumps(body)  # escapes a lone surrogate as "\ud800", as JSON allows


def _completion(server: Served, **fields: Any) -> str:
    return json.dumps({"model": server.model, "prompt": "hi", "max_tokens": 2} | fields)


def _user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CASES = (  # (name, path, body builder, status, text the message must contain, param)
    ("malformed JSON", CHAT, lambda s: '{"model": ', 400, "JSON", None),
    ("body not an object", COMPLETIONS, lambda s: "[1, 2]", 400, "request body", None),
    ("missing field", COMPLETIONS, lambda s: json.dumps({"model": s.model}), 400, "prompt",
     "prompt"),
    ("string max_tokens", CHAT, lambda s: _chat(s, max_tokens="ten"), 400, "max_tokens",
     "max_tokens"),
    ("string temperature", CHAT, lambda s: _chat(s, temperature="hot"), 400, "temperature",
     "temperature"),
    ("negative max_tokens", CHAT, lambda s: _chat(s, max_tokens=-1), 400, "max_tokens",
     "max_tokens"),
    ("top_p of 0", CHAT, lambda s: _chat(s, top_p=0), 400, "greater than 0", "top_p"),
    ("empty messages", CHAT, lambda s: _chat(s, messages=[]), 400, "messages", "messages"),
    ("unknown role", CHAT, lambda s: _chat(s, messages=[{"role": "robot", "content": "x"}]),
     400, "'user'", "messages.0.role"),
    ("content of no accepted type", CHAT, lambda s: _chat(s, messages=_user(5)), 400,
     "should be a valid string or a valid list", "messages.0.content"),
    ("a bad content part", CHAT, lambda s: _chat(s, messages=_user([{"type": "image"}])),
     400, "'text'", "messages.0.content.0.type"),
    ("prompt of floats", COMPLETIONS, lambda s: _completion(s, prompt=[1.5]), 400,
     "valid integer", "prompt.0"),
    ("n > 1", CHAT, lambda s: _chat(s, n=2), 400, "n", "n"),
    ("token out of vocab", COMPLETIONS, lambda s: _completion(s, prompt=[1, 10**6]), 400,
     "vocabulary", "prompt"),
    ("unknown model", CHAT, lambda s: _chat(s, model="gpt-9"), 404, "gpt-9", "model"),
    ("unknown model, long prompt", COMPLETIONS,  # the model is checked before tokenizing
     lambda s: _completion(s, model="gpt-9", prompt="ab" * 70000), 404, "gpt-9", "model"),
    ("too long", COMPLETIONS, lambda s: _completion(s, prompt="a " * 5000), 400,
     "maximum context length", "prompt"),
    ("token ids over the context", COMPLETIONS, lambda s: _completion(s, prompt=[1] * 5000),
     400, "5000 token ids cannot fit", "prompt"),
    ("unknown model, token ids over the context", COMPLETIONS,  # the model comes first
     lambda s: _completion(s, model="gpt-9", prompt=[1] * 5000), 404, "gpt-9", "model"),
    ("too long to tokenize", COMPLETIONS, lambda s: _completion(s, prompt="ab" * 70000), 400,
     "refused before it is tokenized", "prompt"),
    ("body over the limit", COMPLETIONS, lambda s: _completion(s, prompt="a" * 2**21), 413,
     "larger than", None),
    # input that looks valid and once crashed a tokenizer or the response's encoder
    ("lone surrogate in a prompt", COMPLETIONS, lambda s: _completion(s, prompt="a\ud800b"),
     400, "lone surrogate (U+D800) at character 1", "prompt"),
    ("lone surrogate in a message", CHAT, lambda s: _chat(s, messages=_user("a\udfffb")), 400,
     "lone surrogate", "messages.0.content"),
    ("lone surrogate in a part", CHAT,
     lambda s: _chat(s, messages=_user([{"type": "text", "text": "\ud83d"}])), 400,
     "lone surrogate", "messages.0.content.0.text"),
    ("lone surrogate as the model", CHAT, lambda s: _chat(s, model="\ud800"), 400,
     "lone surrogate", "model"),
    ("seed beyond int64", COMPLETIONS, lambda s: _completion(s, seed=2**63), 400,
     "less than or equal to 9223372036854775807", "seed"),
    # fields the server cannot honour: refused by name, never silently ignored
    ("stop strings", CHAT, lambda s: _chat(s, stop=["\n"]), 400, "stop sequences", "stop"),
    ("echo", COMPLETIONS, lambda s: _completion(s, echo=True), 400, "echo", "echo"),
    ("suffix", COMPLETIONS, lambda s: _completion(s, suffix="end"), 400, "suffix", "suffix"),
    ("best_of", COMPLETIONS, lambda s: _completion(s, best_of=3), 400, "best_of", "best_of"),
    ("penalties", CHAT, lambda s: _chat(s, presence_penalty=0.5), 400, "penalties",
     "presence_penalty"),
    ("logit_bias", CHAT, lambda s: _chat(s, logit_bias={"5": 100}), 400, "logit_bias",
     "logit_bias"),
    ("JSON mode", CHAT, lambda s: _chat(s, response_format={"type": "json_object"}), 400,
     "text", "response_format"),
    ("tools that must be called", CHAT,
     lambda s: _chat(s, tools=[{"type": "function", "function": {"name": "f"}}],
                     tool_choice="required"), 400, "cannot call tools", "tool_choice"),
    ("tools the model may call", CHAT,
     lambda s: _chat(s, tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "cannot call tools", "tools"),
    ("streamed log probabilities", CHAT, lambda s: _chat(s, logprobs=True, stream=True), 400,
     "streaming", "logprobs"),
    ("top_logprobs alone", CHAT, lambda s: _chat(s, top_logprobs=3), 400, "logprobs: true",
     "top_logprobs"),
    ("streamed logprobs 0", COMPLETIONS, lambda s: _completion(s, logprobs=0, stream=True),
     400, "streaming", "logprobs"),
    ("JSON mode on completions", COMPLETIONS,
     lambda s: _completion(s, response_format={"type": "json_object"}), 400, "text",
     "response_format"),
    # vLLM's extensions that would change the output if ignored
    ("stop_token_ids", CHAT, lambda s: _chat(s, stop_token_ids=[2]), 400, "stop_token_ids",
     "stop_token_ids"),
    ("min_tokens", COMPLETIONS, lambda s: _completion(s, min_tokens=4), 400, "min_tokens",
     "min_tokens"),
    ("ignore_eos", CHAT, lambda s: _chat(s, ignore_eos=True), 400, "ignore_eos", "ignore_eos"),
    ("repetition_penalty", CHAT, lambda s: _chat(s, repetition_penalty=1.2), 400,
     "penalties", "repetition_penalty"),
    ("NaN temperature", CHAT, lambda s: _chat(s, temperature=float("nan")), 400,
     "finite number", "temperature"),
    ("a batch of prompts", COMPLETIONS, lambda s: _completion(s, prompt=["a", "b"]), 400,
     "one prompt", "prompt"),
    # bodies that are not JSON text at all
    ("not UTF-8", COMPLETIONS, lambda s: b'{"model": "\xff"}', 400, "UTF-8", None),
    ("UTF-16", COMPLETIONS, lambda s: _completion(s).encode("utf-16"), 400, "UTF-8", None),
    ("nested too deeply", COMPLETIONS, lambda s: "[" * 50_000 + "]" * 50_000, 400,
     "nested too deeply", None),
)


class TestBadRequests:
    @pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
    def test_error_shape(self, shared: Served, case: tuple[Any, ...]) -> None:
        _, path, body, status, text, param = case
        code, payload, _ = post(shared.url, path, body(shared))
        assert code == status
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert text in error["message"] and error["param"] == param
        assert not any(name in error["message"] for name in BRANCH_NAMES), error["message"]
        reply = shared.client().completions.create(model=shared.model, prompt="ok",
                                                   max_tokens=2)
        assert reply.usage.completion_tokens == 2  # still serving

    @pytest.mark.parametrize("fields", [{"stream": None}, {"n": None}, {"top_k": 0},
                                        {"top_k": -1}])
    def test_what_openai_and_vllm_accept_is_accepted(self, shared: Served,
                                                     fields: dict[str, Any]) -> None:
        """null means the default (OpenAI); top_k 0 and -1 mean off (vLLM)."""
        for body in (_chat(shared, **fields), _completion(shared, **fields)):
            code, payload, _ = post(shared.url, CHAT if "messages" in body else COMPLETIONS,
                                    body)
            assert code == 200, payload
            assert payload["usage"]["completion_tokens"] == 2

    def test_a_huge_model_name_is_not_quoted_whole(self, shared: Served) -> None:
        code, payload, _ = post(shared.url, COMPLETIONS,
                                _completion(shared, model="m" * 100_000))
        assert code == 404 and "100000 characters" in payload["error"]["message"]
        assert len(payload["error"]["message"]) < 1000

    def test_openai_client_exceptions(self, shared: Served) -> None:
        client = shared.client()
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="nope", messages=_user("x"))
        assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="messages"):
            client.chat.completions.create(model=shared.model, messages=[])
        with pytest.raises(openai.BadRequestError, match="echo"):
            client.completions.create(model=shared.model, prompt="x", echo=True)


def _exchange(conn: http.client.HTTPConnection, method: str, path: str,
              body: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body.encode() if body else None, headers=headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


class TestSameConnection:
    """A keep-alive connection survives a refused request and an unexpected crash."""

    def test_a_refusal_and_a_crash_leave_the_connection_open(self, model: HybridModel) -> None:
        config = ServerConfig(capacity="16MB")
        app = create_app(build_backend(config, model), config)

        @app.get("/crash")
        async def crash() -> None:  # a bug no handler knows, planted for this test
            raise RuntimeError("planted")

        with run_app(app) as url:
            conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=30)
            bad = json.dumps({"model": config.name, "prompt": "a\ud800b", "max_tokens": 2})
            assert _exchange(conn, "POST", COMPLETIONS, bad)[0] == 400
            status, body = _exchange(conn, "GET", "/crash")
            assert status == 500 and body["error"]["type"] == "internal_error"
            assert "RuntimeError: planted" in body["error"]["message"]
            sock = conn.sock
            assert _exchange(conn, "GET", "/health") == (200, {"status": "ok"})
            assert conn.sock is sock  # the same connection answered: it was kept alive
            conn.close()
            metrics = scrape(url)
        assert metrics["marconi:request_failure_total{reason=internal}"] == 1
        assert metrics["marconi:request_rejected_total{reason=invalid_request}"] == 1
