"""The reference engine on a paged KV pool and a state-slot pool (`PagedStore`): exact
against uncached forwards, and the pools hold what the cache's books say."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.engine.reference import assert_matches_reference

from marconi.engines.hf import Capture, Engine, HybridModel
from marconi.engines.hf.paged_store import PagedStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paged_engine.py"


def _capacity(model: HybridModel, page: int, slots: int, tokens: int = 260) -> int:
    """KV for about `tokens` tokens in whole pages, and `slots` states (4 without a pool):
    small enough that the workload evicts."""
    state = model.spec.ssm_bytes + 4 * model.vocab_size  # states keep their logits
    pages = -(-tokens // page)
    return pages * page * model.spec.kv_bytes_per_token + (slots or 4) * state


def _serve(engine: Engine, rng: np.random.Generator, turns: int = 5, steps: int = 4,
           forced: bool = False) -> list[int]:
    """Branches off a shared prefix (mid-page splits and copies) between the turns of a
    conversation (each input the last one + its output + new tokens: partial blocks that
    grow, merges that join pages), then an exact repeat; every request held to an
    uncached forward and the pools to the books. Returns the hits."""
    system, hits = rng.integers(0, 256, 45), []
    history: np.ndarray = rng.integers(0, 256, 30)
    for i in range(turns):
        for prompt in (np.concatenate([system, rng.integers(0, 256, 7 + i)]), history):
            output = rng.integers(0, 256, 3).astype(np.int32) if forced else None
            got = engine.generate(prompt, steps, output=output)
            assert_matches_reference(engine.model, prompt, got, greedy=not forced)
            check_pools(engine)
            hits.append(got.hit)
        history = np.concatenate([history, got.output, rng.integers(0, 256, 6)])
    return hits


def check_pools(engine: Engine) -> None:
    """Pages in use x page bytes = the cache's KV bytes; slots in use = states held."""
    store, stats, layout = engine.store, engine.cache.stats, engine.cache.layout
    assert isinstance(store, PagedStore)
    assert store.kv_bytes == stats.kv_bytes
    assert store.pool.in_use * layout.page_size * engine.model.spec.kv_bytes_per_token \
        == stats.kv_bytes
    assert store.slots_in_use == stats.states
    assert store.state_bytes + store.logits_bytes == stats.ssm_bytes
    if layout.pooled:
        assert stats.states <= layout.state_slots


@pytest.mark.parametrize(("system", "page", "slots"), [
    ("marconi", 4, 3), ("sglang+", 1, 4), ("vllm+", 16, 0), ("marconi+", 4, 3)])
def test_paged_runs_equal_uncached_forwards(get_model, system, page, slots):
    model = get_model("bamba")
    engine = Engine(model, system, _capacity(model, page, slots), page_size=page,
                    state_slots=slots, alpha=1.0 if system == "marconi" else None)
    hits = _serve(engine, np.random.default_rng(0))
    assert max(hits) > 0 and engine.cache.stats.evictions > 0
    assert engine.cache.stats.states_not_captured == 0


@pytest.mark.parametrize("arch", ["zamba2", "nemotron_h"])
def test_other_families_chunk_capture_and_forced_outputs(get_model, arch):
    model = get_model(arch)
    engine = Engine(model, "sglang+", _capacity(model, 8, 3), page_size=8, state_slots=3,
                    capture=Capture.CHUNK if model.chunk_size else Capture.EXACT)
    assert max(_serve(engine, np.random.default_rng(1), turns=3, forced=True)) > 0


def test_evicting_everything_empties_both_pools(get_model):
    model = get_model("bamba")
    engine = Engine(model, "marconi", _capacity(model, 4, 3), page_size=4, state_slots=3,
                    alpha=1.0)
    _serve(engine, np.random.default_rng(2), turns=3)
    engine.cache.evict(engine.cache.bytes)
    assert engine.store.nbytes == 0 and engine.store.pool.in_use == 0
    assert engine.store.slots_in_use == 0  # type: ignore[union-attr]


def test_a_pool_smaller_than_the_books_overflows_loudly(get_model):
    """The pools are sized by the cache's books: a store with fewer pages than the books
    allow is an error, not a silent overshoot."""
    model = get_model("bamba")
    engine = Engine(model, "sglang+", _capacity(model, 4, 3), page_size=4, state_slots=3)
    engine.store.pool.limit = engine.store.kv.limit = 3  # type: ignore[union-attr]
    with pytest.raises(MemoryError, match="exhausted"):
        engine.generate(np.arange(40) % 256, 2)


def test_the_worked_example_is_exact():
    spec = importlib.util.spec_from_file_location("paged_engine", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["paged_engine"] = example  # its dataclasses look their module up
    try:
        spec.loader.exec_module(example)
    finally:
        del sys.modules["paged_engine"]
    assert example.main(["--page-size", "8", "--state-slots", "4", "--kv-pages", "30"]) == 0


def test_a_merge_joins_pages_at_a_seam_inside_a_page(get_model):
    """A turn hung inside a page copies it; evicting the turn before merges the two edges
    (the copy's tokens move into the shared page); the next turn reads the joined pages."""
    model, rng = get_model("bamba"), np.random.default_rng(3)
    engine = Engine(model, "marconi", "1GB", page_size=4, state_slots=8, alpha=0.0)
    prompt = rng.integers(0, 256, 22)  # + 3 output tokens: a state at 25, inside page 24
    for _turn in range(3):
        got = engine.generate(prompt, 3)
        assert_matches_reference(model, prompt, got)
        check_pools(engine)
        if _turn == 1:
            assert engine.cache.books.copies  # the turn at 25 copied page 24
            engine.cache.evict(1)  # LRU: the first turn's state, merged into the second's
            assert not engine.cache.books.copies and engine.cache.stats.evictions == 1
            check_pools(engine)
        prompt = np.concatenate([prompt, got.output, rng.integers(0, 256, 6)])
    assert got.hit == 34  # through the merged edge
