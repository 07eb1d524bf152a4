"""The API over a real server and the real `openai` client: cache hits, streaming."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai
import pytest

from marconi.engines.hf import HybridModel
from marconi.server.chat import EmbeddedCodec, Message
from tests.server.harness import Served, scrape, serve

SYSTEM = "You are a careful assistant who answers briefly and cites sources."


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _chat(server: Served, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return server.client().chat.completions.create(model=server.model, messages=messages,
                                                   max_tokens=8, **kw)


class TestMultiTurn:
    def test_cached_tokens_cover_the_previous_turn(self, server: Served) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        cached, previous = [], 0
        for turn in range(4):
            messages.append({"role": "user", "content": f"Question {turn}: why is the sky?"})
            reply = _chat(server, messages)
            usage = reply.usage
            cached.append(usage.prompt_tokens_details.cached_tokens)
            # the state after the previous turn's last token was admitted: all of it hits
            assert cached[-1] == previous
            previous = usage.prompt_tokens + usage.completion_tokens
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        assert cached[0] == 0 and cached == sorted(cached) and len(set(cached)) == 4


    def test_a_regenerate_misses_only_the_last_message(self, server: Served) -> None:
        """README: the state after a prompt alone is not admitted (measured not to pay), so
        a temperature-0 repeat of a turn hits where the previous turn ended."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Tell me a story."}]
        first = _chat(server, messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
        turn, again = _chat(server, messages), _chat(server, messages)
        previous = first.usage.prompt_tokens + first.usage.completion_tokens
        assert again.choices[0].message.content == turn.choices[0].message.content
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached == turn.usage.prompt_tokens_details.cached_tokens == previous
        assert cached < again.usage.prompt_tokens


class TestSharedSystemPrompt:
    USERS = ("Apples or pears?", "Bicycles are fast.", "Cats sleep a lot.",
             "Dolphins swim.", "Elephants remember.", "Foxes run.")

    def test_hit_from_the_third_request_on(self, server: Served) -> None:
        cached = []
        for user in self.USERS:
            reply = _chat(server, [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": user}])
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        codec = EmbeddedCodec()
        prompts = [codec.render_chat([Message("system", SYSTEM), Message("user", u)])
                   for u in self.USERS[:2]]
        shared = _lcp(*prompts)  # the branch point checkpointed on the 2nd occurrence
        assert shared > len(codec.encode_prompt(SYSTEM))
        assert cached == [0, 0] + [shared] * (len(self.USERS) - 2)


    def test_marconi_plus_hits_it_on_its_second_use(self, model: HybridModel) -> None:
        """From a fresh server's first requests: the end of the system prompt (the first
        message boundary) is checkpointed on its first use."""
        with serve(model, capacity="256MB", max_tokens=4, system="marconi+") as server:
            cached = [_chat(server, [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": user}])
                      .usage.prompt_tokens_details.cached_tokens for user in self.USERS[:3]]
        _, ends = EmbeddedCodec().render([Message("system", SYSTEM), Message("user", "x")])
        assert cached[:2] == [0, ends[0]] and cached[2] >= ends[0]


class TestStreaming:
    def test_chunks_text_and_final_usage(self, server: Served) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
        plain = _chat(server, messages)
        stream = _chat(server, messages, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        content = [c for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(content) >= 2 and chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content for c in content)
        assert text == plain.choices[0].message.content  # greedy: same tokens, same text
        finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert [c.choices[0].finish_reason for c in finals] == ["length"]
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens == 8
        assert all(c.usage is None for c in chunks[:-1])

    def test_streamed_turn_hits_the_previous_one(self, server: Served) -> None:
        first = _chat(server, [{"role": "user", "content": "Tell me a story."}])
        messages = [{"role": "user", "content": "Tell me a story."},
                    {"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "Another one."}]
        chunks = list(_chat(server, messages, stream=True,
                            stream_options={"include_usage": True}))
        expected = first.usage.prompt_tokens + first.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == expected

    def test_sse_wire_format_ends_with_done(self, server: Served) -> None:
        body = json.dumps({"model": server.model, "prompt": "Once upon", "stream": True,
                           "max_tokens": 3}).encode()
        request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events = [e for e in response.read().decode().split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
        payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        assert {p["object"] for p in payloads} == {"text_completion"}
        assert payloads[-1]["choices"][0]["finish_reason"] == "length"


class TestCompletions:
    def test_text_and_token_prompts_share_the_cache(self, server: Served) -> None:
        client = server.client()
        shared = "The quick brown fox jumps over the lazy dog. " * 3
        cached = [client.completions.create(model=server.model, prompt=shared + end,
                                            max_tokens=4).usage.prompt_tokens_details
                  .cached_tokens for end in ("Apples", "Bananas", "Cherries")]
        assert cached[0] == cached[1] == 0 and cached[2] > 0  # branch point: 2nd occurrence
        tokens = EmbeddedCodec().encode_prompt(shared + "Dates")
        reply = client.completions.create(model=server.model, prompt=tokens, max_tokens=4)
        assert reply.usage.prompt_tokens == len(tokens)
        assert reply.usage.prompt_tokens_details.cached_tokens == cached[2]
        assert reply.choices[0].finish_reason in ("length", "stop")

    def test_an_empty_message_is_served(self, server: Served) -> None:
        """An empty prompt or message is data (a conversation may open with one): it is
        served, its prompt the template's tokens (the BOS at least), and cached as any
        other; only an empty list of token ids has nothing to run and gets a 400."""
        client = server.client()
        for _ in range(2):
            reply = client.completions.create(model=server.model, prompt="", max_tokens=3)
            assert reply.usage.prompt_tokens >= 1 and reply.usage.completion_tokens == 3
        first = _chat(server, [{"role": "user", "content": ""}])
        assert first.usage.prompt_tokens >= 1 and first.choices[0].message.content
        second = _chat(server, [{"role": "user", "content": ""},
                                {"role": "assistant", "content": first.choices[0].message.content},
                                {"role": "user", "content": ""}])
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        with pytest.raises(openai.BadRequestError, match="no tokens"):
            client.completions.create(model=server.model, prompt=[], max_tokens=3)


class TestInfoRoutes:
    def test_models_health_metrics(self, server: Served) -> None:
        models = server.client().models.list()
        assert [m.id for m in models.data] == [server.model]
        with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
            assert json.loads(response.read()) == {"status": "ok"}
        metrics = scrape(server.url)
        assert metrics["marconi:cache_capacity_bytes"] == server.config.capacity_bytes
        assert metrics["marconi:prefix_cache_queries_total"] == 0
        assert metrics["marconi:num_requests_waiting"] == 0
