"""Bounded load tests, loopback only: 4 concurrent clients and 200 short requests; and
10 MB prompts sent while other clients run, which must not stall anyone."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from marconi.core.integrity import check_integrity
from marconi.engines.hf import HybridModel, tiny_model
from marconi.server.backend import EMBEDDED_VOCAB
from tests.server.harness import Served, scrape, serve, wait_for

CLIENTS, REQUESTS_EACH, TURNS = 4, 50, 5
CAPACITY = "1MB"  # small enough that the cache must evict, so the bound is exercised
SYSTEMS = ("You are a terse assistant.", "You answer in French, always politely.",
           "You are a pirate who explains physics with great enthusiasm.")


def _client_loop(server: Served, index: int, usages: list[Any]) -> None:
    """Conversations of TURNS turns, each opened by one of a few shared system prompts."""
    client = server.client()
    messages: list[dict[str, Any]] = []
    for k in range(REQUESTS_EACH):
        if k % TURNS == 0:
            messages = [{"role": "system", "content": SYSTEMS[(index + k) % len(SYSTEMS)]}]
        messages.append({"role": "user", "content": f"client {index} asks question {k}"})
        reply = client.chat.completions.create(model=server.model, messages=messages,
                                               max_tokens=4)
        usages.append(reply.usage)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def _watch(server: Served, done: threading.Event, held: list[float]) -> None:
    """Sample the cache's bytes while the load runs (bounded by the load itself)."""
    while not done.wait(0.1):
        metrics = scrape(server.url)
        held.append(metrics["marconi:cache_kv_bytes"] + metrics["marconi:cache_ssm_bytes"])


class TestLoad:
    def test_no_errors_bounded_memory_and_exact_counters(self, model: HybridModel) -> None:
        with serve(model, capacity=CAPACITY) as server:
            usages: list[list[Any]] = [[] for _ in range(CLIENTS)]
            threads = [threading.Thread(target=_client_loop, args=(server, i, usages[i]))
                       for i in range(CLIENTS)]
            done, held = threading.Event(), []
            watcher = threading.Thread(target=_watch, args=(server, done, held))
            for thread in (*threads, watcher):
                thread.start()
            deadline = time.monotonic() + 600  # ~15 s on an idle machine
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            # every client done before the scrape (a late one would make it stale)
            assert not any(thread.is_alive() for thread in threads)
            done.set()
            watcher.join(10)
            metrics = scrape(server.url)
        flat = [u for per_client in usages for u in per_client]
        assert len(flat) == CLIENTS * REQUESTS_EACH  # every request answered (no 5xx)
        cached = sum(u.prompt_tokens_details.cached_tokens for u in flat)
        assert metrics["marconi:prefix_cache_hits_total"] == cached > 0
        assert metrics["marconi:prefix_cache_queries_total"] == sum(u.prompt_tokens for u in flat)
        assert metrics["marconi:prefix_cache_requests_total"] == len(flat)
        assert metrics["marconi:request_success_total{finished_reason=length}"] == len(flat)
        capacity = server.config.capacity_bytes
        assert metrics["marconi:cache_evictions_total"] > 0
        assert max(held) <= capacity and metrics["marconi:cache_peak_bytes"] <= capacity
        cache, store = server.backend.engine.cache, server.backend.engine.store
        assert store.kv_bytes == cache.stats.kv_bytes  # tensors held == accounting
        assert store.state_bytes + store.logits_bytes == cache.stats.ssm_bytes
        check_integrity(cache)


HUGE = 10 * 10**6  # bytes of prompt: far over the body limit and any context


def _health_latencies(server: Served, done: threading.Event, seen: list[float]) -> None:
    """Time `/health` every 50 ms until `done` (bounded by the test around it)."""
    while not done.wait(0.05):
        start = time.monotonic()
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
                response.read()
        except OSError:  # no answer in 10 s (or none at all): the worst case, recorded
            seen.append(float("inf"))
            return
        seen.append(time.monotonic() - start)


def _chatter(server: Served, done: threading.Event, answered: list[int | Exception]) -> None:
    client = server.client(timeout=30)
    for k in range(200):  # bounded; stops when `done` is set
        if done.is_set():
            return
        try:
            reply = client.chat.completions.create(
                model=server.model, max_tokens=2,
                messages=[{"role": "user", "content": f"question {k}"}])
        except Exception as err:  # reported by the test, not lost in a thread
            answered.append(err)
            return
        answered.append(reply.usage.completion_tokens)


def _send_raw(url: str, body: bytes, *, chunked: bool = False) -> tuple[int, dict[str, Any]]:
    """POST `body` to /v1/completions, declaring its length or sending it in chunks."""
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", body=iter([body]) if chunked else body,
                 headers=headers, encode_chunked=chunked)
    response = conn.getresponse()
    answer = response.status, json.loads(response.read())
    conn.close()
    return answer


@contextmanager
def _others_running(server: Served) -> Iterator[None]:
    """Two chat clients and a `/health` prober run around the block; on exit, `/health`
    must have answered within 1 s every time, and every chat request without an error."""
    done = threading.Event()
    latencies: list[float] = []
    answered: list[int | Exception] = []
    threads = [threading.Thread(target=_health_latencies, args=(server, done, latencies)),
               *(threading.Thread(target=_chatter, args=(server, done, answered))
                 for _ in range(2))]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(answered) >= 2, what="the chat clients to start")
    try:
        yield
        # a fast machine finishes the block within a few probes: it must span five
        wait_for(lambda: len(latencies) >= 5, what="five /health probes")
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    assert len(latencies) >= 5 and max(latencies) < 1.0, f"/health took {max(latencies):.2f} s"
    assert answered and all(n == 2 for n in answered), answered


def _huge_prompt(model: str) -> bytes:
    return b'{"model": "%s", "prompt": "%s"}' % (model.encode(), b"word " * (HUGE // 5))


class TestHostileLoad:
    def test_huge_bodies_are_refused_before_parsing(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB") as server, _others_running(server):
            huge = _huge_prompt(server.model)
            answers = [_send_raw(server.url, huge),
                       _send_raw(server.url, _huge_prompt("no-such-model")),
                       _send_raw(server.url, huge, chunked=True)]
            below = json.dumps({"model": server.model, "prompt": "word " * 200_000})
            answers.append(_send_raw(server.url, below.encode()))  # 1 MB: under the limit
        assert [status for status, _ in answers] == [413, 413, 413, 400]
        assert {a["error"]["code"] for _, a in answers[:3]} == {"body_too_large"}
        assert answers[-1][1]["error"]["code"] == "context_length_exceeded"

    def test_a_huge_prompt_is_tokenized_off_the_event_loop(self) -> None:
        """A model whose context takes 10 MB of text: the prompt is read and tokenized
        (then refused: it is 2M tokens), and no one waits meanwhile."""
        long = tiny_model("bamba", vocab_size=EMBEDDED_VOCAB, max_position_embeddings=2**20)
        with serve(long, capacity="16MB") as server, _others_running(server):
            status, answer = _send_raw(server.url, _huge_prompt(server.model))
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert "2000002 in the prompt" in answer["error"]["message"]  # it was tokenized

    def test_a_huge_token_id_prompt_is_parsed_off_the_event_loop(self) -> None:
        """10M token ids (50 MB of JSON, under that model's 256 MB body limit): decoding
        and validating them takes seconds, in C calls that hold the GIL, so a thread is not
        enough: they are counted from a skim of the body and refused unread."""
        long = tiny_model("bamba", vocab_size=EMBEDDED_VOCAB, max_position_embeddings=2**20)
        with serve(long, capacity="16MB") as server, _others_running(server):
            ids = b"415, " * 10_000_000
            body = b'{"model": "%s", "prompt": [%s1]}' % (server.model.encode(), ids)
            status, answer = _send_raw(server.url, body)
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert "10000001 token ids cannot fit" in answer["error"]["message"]
