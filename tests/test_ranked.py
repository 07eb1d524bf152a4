"""Declared priorities (marconi.core.priority) run by `Ranked` on the Python core: the
declared LRU is the paper's LRU request by request, and LFU keeps what was hit often."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core import compiled
from marconi.core.cache import PrefixCache
from marconi.core.compiled import replay_cache
from marconi.core.integrity import check_integrity
from marconi.core.priority import Feature, Key, Priority, Term
from marconi.core.ranked import Ranked
from marconi.paper.admission import Judicious
from marconi.paper.eviction import LRULeaf
from marconi.peers.lfu import LFU
from marconi.peers.slru import SLRU
from marconi.workload import TraceOptions, load_trace
from tests.helpers import SMALL, serve

LRU = Priority("lru", keys=(Key(Term(Feature.RECENCY)),))
CORES = [c for c in compiled.CORES if c == "python" or compiled.built()]
KV, STATE = SMALL.kv_bytes_per_token, SMALL.ssm_bytes


def replay(eviction: Ranked | LRULeaf, capacity: int) -> list[int]:
    cache = PrefixCache(SMALL, capacity, Judicious(), eviction)
    trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=12))
    hits = []
    for request in trace.requests:
        tokens = np.concatenate([request.input_tokens, request.output_tokens])
        hits.append(serve(cache, None, tokens, len(request.input_tokens)))
        check_integrity(cache)
    return hits


@pytest.mark.parametrize("capacity", [300_000, 1_000_000, 4_000_000])
def test_the_declared_lru_is_the_paper_lru(capacity: int) -> None:
    """LRU over leaves declared as one key (the last touch) evicts as `LRULeaf` does."""
    declared, written = replay(Ranked(LRU), capacity), replay(LRULeaf(), capacity)
    assert declared == written
    assert sum(declared) > 0


def _cache(core: str, capacity: int, eviction: Ranked,
           monkeypatch: pytest.MonkeyPatch) -> PrefixCache:
    """A cache of `eviction` on `core` (the compiled core evaluates the declaration)."""
    monkeypatch.setenv(compiled.CORE_ENV, core)
    cache = replay_cache(SMALL, capacity, Judicious(), eviction)
    assert getattr(cache, "compiled", False) == (core == "compiled")
    return cache


def _check(cache: PrefixCache) -> None:
    if getattr(cache, "compiled", False):
        cache.check()  # type: ignore[attr-defined]
    else:
        check_integrity(cache)


@pytest.mark.parametrize("core", CORES)
def test_lfu_keeps_the_leaf_hit_most_often(core: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for two sequences: A committed three times, B once and later; a third
    sequence C evicts B under LFU (fewer hits) and A under LRU (touched earlier)."""
    a, b, c = (np.arange(start, start + 100, dtype=np.int32) for start in (0, 1000, 2000))
    room = 2 * (100 * KV + STATE) + 50 * KV
    survivors = {}
    for name, eviction in (("lfu", Ranked(LFU)), ("lru", Ranked(LRU))):
        cache = _cache(core, room, eviction, monkeypatch)
        for tokens in (a, a, a, b, c):
            serve(cache, None, tokens, len(tokens))
        _check(cache)
        survivors[name] = [cache.lookup(t).hit for t in (a, b)]
    assert survivors["lfu"] == [100, 0]  # A kept
    assert survivors["lru"] == [0, 100]


@pytest.mark.parametrize(("a_commits", "b_commits", "kept"),
                         [(2, 1, [100, 0]), (1, 1, [0, 100]), (3, 2, [0, 100])])
@pytest.mark.parametrize("core", CORES)
def test_slru_protects_a_leaf_hit_twice(a_commits: int, b_commits: int, kept: list[int],
                                        core: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SLRU's segment is a step at two hits: A committed twice is protected and outlives
    B, committed once and later; committed once, A is probationary as B and leaves first
    (least recently used within the segment); both protected, A leaves first too, where
    LFU would keep it (three hits against two)."""
    a, b, c = (np.arange(start, start + 100, dtype=np.int32) for start in (0, 1000, 2000))
    cache = _cache(core, 2 * (100 * KV + STATE) + 50 * KV, Ranked(SLRU), monkeypatch)
    for tokens in (*[a] * a_commits, *[b] * b_commits, c):
        serve(cache, None, tokens, len(tokens))
    _check(cache)
    assert [cache.lookup(t).hit for t in (a, b)] == kept


def test_a_split_keeps_the_count_in_both_halves() -> None:
    """SGLang's split copies the child's hit count into its new parent."""
    eviction = Ranked(LFU)
    cache = PrefixCache(SMALL, 10**9, Judicious(), eviction)
    a = np.arange(100, dtype=np.int32)
    for _ in range(3):
        serve(cache, None, a, 100)
    branch = np.concatenate([a[:40], np.arange(500, 540, dtype=np.int32)])
    serve(cache, None, branch, 80)
    counts = {n.depth: eviction.hits[n] for n in eviction.hits if n.parent is not None}
    assert counts == {40: 4, 80: 1, 100: 3}  # the split head, the new branch, the old tail


def test_a_priority_needs_keys_and_finite_weights() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        Priority("empty", keys=())
    with pytest.raises(ValueError, match="weight must be finite"):
        Term(Feature.HITS, weight=float("nan"))
