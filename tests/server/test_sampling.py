"""Sampling over HTTP with the real `openai` client: extreme temperatures and seeds,
top_p, and log probabilities checked against the engine's own logits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from marconi.engines.hf import Engine, HybridModel
from tests.server.harness import Served, serve

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def shared(model: HybridModel) -> Iterator[Served]:
    with serve(model, capacity="64MB", max_tokens=6) as served:
        yield served


def _text(server: Served, **kw: Any) -> str:
    reply = server.client().completions.create(model=server.model, prompt=PROMPT, **kw)
    return str(reply.choices[0].text)


def _streamed_chat(server: Served, **kw: Any) -> str:
    """The streamed reply's text; the client raises on an error event."""
    chunks = server.client().chat.completions.create(model=server.model, messages=MESSAGES,
                                                     stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


class TestTemperature:
    @pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
    def test_a_vanishing_temperature_is_greedy(self, shared: Served,
                                               temperature: float) -> None:
        assert _text(shared, temperature=temperature, seed=3) == _text(shared, temperature=0)
        assert (_streamed_chat(shared, temperature=temperature)
                == _streamed_chat(shared, temperature=0))


class TestSeed:
    @pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 2 * 10**13, -5])
    def test_any_int64_seed_samples_reproducibly(self, shared: Served, seed: int) -> None:
        first = _text(shared, temperature=1.0, seed=seed)
        assert first == _text(shared, temperature=1.0, seed=seed)


class TestTopP:
    def test_a_tiny_nucleus_is_greedy_and_a_full_one_changes_nothing(
            self, shared: Served) -> None:
        assert _text(shared, temperature=1.5, top_p=1e-9, seed=1) == _text(shared,
                                                                          temperature=0)
        sampled = [_text(shared, temperature=1.5, seed=s) for s in range(3)]
        assert [_text(shared, temperature=1.5, top_p=1.0, seed=s) for s in range(3)] == sampled
        assert len(set(sampled)) > 1  # the seeds really sample

    @pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
    def test_a_nucleus_below_float32_is_greedy_not_an_error(self, shared: Served,
                                                           top_p: float) -> None:
        """1e-46 and below are 0 in float32: the nucleus still keeps its first token."""
        assert _text(shared, temperature=1, top_p=top_p, max_tokens=4) \
            == _text(shared, temperature=0, max_tokens=4)
        assert (_streamed_chat(shared, temperature=1, top_p=top_p)
                == _streamed_chat(shared, temperature=0))


def _engine_logprobs(model: HybridModel, prompt: list[int], n: int) -> torch.Tensor:
    """The log-softmax of the logits that chose each greedy token, from a fresh engine."""
    gen = Engine(model, "marconi", "64MB").generate(np.asarray(prompt), n)
    return torch.log_softmax(gen.logits.float(), dim=-1)


class TestLogprobs:
    PROMPT_IDS = (1, 415, 2936, 9060, 285, 1693)

    def test_completions_match_the_engine(self, shared: Served, model: HybridModel) -> None:
        reply = shared.client().completions.create(model=shared.model, prompt=list(self.PROMPT_IDS),
                                                   max_tokens=5, logprobs=2)
        logprobs = reply.choices[0].logprobs
        expected = _engine_logprobs(model, list(self.PROMPT_IDS), 5)
        chosen = expected.max(dim=-1).values.tolist()  # greedy: the chosen token is the best
        assert logprobs.token_logprobs == pytest.approx(chosen, abs=1e-4)
        assert all(len(top) in (2, 3) for top in logprobs.top_logprobs)  # + the chosen one
        assert [max(top.values()) for top in logprobs.top_logprobs] == pytest.approx(chosen,
                                                                                   abs=1e-4)
        offsets = logprobs.text_offset
        assert offsets[0] == 0 and offsets == sorted(offsets)
        assert "".join(logprobs.tokens).strip() == reply.choices[0].text.strip()

    def test_chat_lists_each_token_with_its_alternatives(self, shared: Served) -> None:
        reply = shared.client().chat.completions.create(
            model=shared.model, messages=MESSAGES, max_tokens=5, logprobs=True,
            top_logprobs=3)
        content = reply.choices[0].logprobs.content
        assert len(content) == reply.usage.completion_tokens == 5
        for entry in content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            best = entry.top_logprobs[0]  # greedy
            assert (best.token, best.bytes) == (entry.token, entry.bytes)
            assert best.logprob == pytest.approx(entry.logprob)
        text = bytes(b for entry in content for b in entry.bytes).decode()
        assert text.strip() == reply.choices[0].message.content.strip()
        plain = shared.client().chat.completions.create(model=shared.model, messages=MESSAGES,
                                                        max_tokens=5)
        assert plain.choices[0].logprobs is None
