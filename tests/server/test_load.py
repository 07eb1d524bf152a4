"""A bounded load test: 4 concurrent clients, 200 short requests, loopback only."""

from __future__ import annotations

import threading
from typing import Any

from marconi.core.integrity import check_integrity
from marconi.engine import HybridModel
from tests.server.harness import Served, scrape, serve

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
        with serve(model, cache_size=CAPACITY) as server:
            usages: list[list[Any]] = [[] for _ in range(CLIENTS)]
            threads = [threading.Thread(target=_client_loop, args=(server, i, usages[i]))
                       for i in range(CLIENTS)]
            done, held = threading.Event(), []
            watcher = threading.Thread(target=_watch, args=(server, done, held))
            for thread in (*threads, watcher):
                thread.start()
            for thread in threads:
                thread.join(150)
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
        capacity = server.config.capacity
        assert metrics["marconi:cache_evictions_total"] > 0
        assert max(held) <= capacity and metrics["marconi:cache_peak_bytes"] <= capacity
        cache, store = server.backend.engine.cache, server.backend.engine.store
        assert store.kv_bytes == cache.stats.kv_bytes  # tensors held == accounting
        assert store.state_bytes + store.logits_bytes == cache.stats.ssm_bytes
        check_integrity(cache)
