"""Bad requests get OpenAI-style 4xx bodies naming the problem; the server keeps serving."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from marconi.engine import HybridModel
from tests.server.harness import Served, scrape, serve, wait_for


def _post(server: Served, path: str, body: bytes | str) -> tuple[int, dict[str, Any]]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(f"{server.url}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _chat_body(server: Served, **fields: Any) -> str:
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2} | fields
    return json.dumps(body)


class TestBadRequests:
    CASES = (  # (name, path, body builder, status, text the message must contain, param)
        ("malformed JSON", "/v1/chat/completions", lambda s: '{"model": ', 400, "JSON", None),
        ("body not an object", "/v1/completions", lambda s: "[1, 2]", 400, "request body",
         None),
        ("missing field", "/v1/completions", lambda s: json.dumps({"model": s.model}), 400,
         "prompt", "prompt"),
        ("string max_tokens", "/v1/chat/completions",
         lambda s: _chat_body(s, max_tokens="ten"), 400, "max_tokens", "max_tokens"),
        ("string temperature", "/v1/chat/completions",
         lambda s: _chat_body(s, temperature="hot"), 400, "temperature", "temperature"),
        ("negative max_tokens", "/v1/chat/completions",
         lambda s: _chat_body(s, max_tokens=-1), 400, "max_tokens", "max_tokens"),
        ("empty messages", "/v1/chat/completions", lambda s: _chat_body(s, messages=[]), 400,
         "messages", "messages"),
        ("unknown role", "/v1/chat/completions",
         lambda s: _chat_body(s, messages=[{"role": "robot", "content": "x"}]), 400,
         "messages.0.role", "messages.0.role"),
        ("n > 1", "/v1/chat/completions", lambda s: _chat_body(s, n=2), 400, "n", "n"),
        ("stop strings", "/v1/chat/completions", lambda s: _chat_body(s, stop=["\n"]), 400,
         "stop sequences", "stop"),
        ("token out of vocab", "/v1/completions",
         lambda s: json.dumps({"model": s.model, "prompt": [1, 10**6]}), 400, "vocabulary",
         "prompt"),
        ("unknown model", "/v1/chat/completions", lambda s: _chat_body(s, model="gpt-9"),
         404, "gpt-9", "model"),
        ("too long", "/v1/completions",
         lambda s: json.dumps({"model": s.model, "prompt": "a " * 5000}), 400,
         "maximum context length", "prompt"),
    )

    @pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
    def test_error_shape(self, server: Served, case: tuple[Any, ...]) -> None:
        _, path, body, status, text, param = case
        code, payload = _post(server, path, body(server))
        assert code == status
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert text in error["message"] and error["param"] == param
        reply = server.client().completions.create(model=server.model, prompt="ok",
                                                   max_tokens=2)
        assert reply.usage.completion_tokens == 2  # still serving

    def test_openai_client_exceptions(self, server: Served) -> None:
        client = server.client()
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="nope", messages=[{"role": "user",
                                                                    "content": "x"}])
        assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="messages"):
            client.chat.completions.create(model=server.model, messages=[])


class TestQueueAndDisconnect:
    def test_full_queue_gives_429_and_a_gone_client_frees_its_request(
            self, model: HybridModel) -> None:
        with serve(model, cache_size="64MB", max_queue=1) as server:
            client = server.client()
            long = client.chat.completions.create(  # runs until its client leaves
                model=server.model, messages=[{"role": "user", "content": "go"}],
                max_tokens=3000, stream=True)
            chunks = iter(long)
            while not next(chunks).choices[0].delta.content:
                pass
            queued: list[Any] = []
            waiter = threading.Thread(target=lambda: queued.append(client.completions.create(
                model=server.model, prompt="wait", max_tokens=2)))
            waiter.start()
            wait_for(lambda: scrape(server.url)["marconi:num_requests_waiting"] == 1,
                     what="one queued request")
            with pytest.raises(openai.RateLimitError) as err:
                client.completions.create(model=server.model, prompt="full", max_tokens=2)
            assert err.value.status_code == 429
            assert err.value.body["code"] == "queue_full"  # type: ignore[index]
            long.close()  # the client goes away mid-stream
            waiter.join(60)
            assert queued and queued[0].usage.completion_tokens == 2
            metrics = scrape(server.url)
            assert metrics["marconi:request_success_total{finished_reason=abort}"] == 1
            assert metrics["marconi:generation_tokens_total"] < 1500  # stopped early
            assert metrics["marconi:request_rejected_total{reason=queue_full}"] == 1
            assert metrics["marconi:num_requests_running"] == 0
