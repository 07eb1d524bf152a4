"""Declared priorities (marconi.core.priority) run by `Ranked` on the Python core and by
the compiled core: the paper's LRU is one (changing it is one change), LFU keeps what was
hit often, SLRU protects what was hit twice."""

from __future__ import annotations

import copy
import functools
import pickle

import numpy as np
import pytest

from marconi.core import compiled
from marconi.core.cache import PrefixCache
from marconi.core.compiled import replay_cache
from marconi.core.compiled_forms import compiled_reason
from marconi.core.integrity import check_integrity
from marconi.core.layout import Layout
from marconi.core.policy import Eviction
from marconi.core.priority import Feature, Key, Priority, Term, key_function, key_value
from marconi.core.ranked import Ranked
from marconi.engines.integrations.common import declared_priority
from marconi.paper import eviction as paper
from marconi.paper.admission import Judicious
from marconi.peers.lfu import LFU
from marconi.peers.slru import SLRU
from marconi.plus.switchable import Mode, Switchable
from marconi.systems import get_system
from marconi.workload import TraceOptions, load_trace
from tests.helpers import SMALL, serve

LRU = paper.LRU
CORES = [c for c in compiled.CORES if c == "python" or compiled.built()]
KV, STATE = SMALL.kv_bytes_per_token, SMALL.ssm_bytes


def replay(cache: PrefixCache) -> list[int]:
    """Each request's hit over a multi-turn trace, the books checked after each."""
    trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=12))
    hits = []
    for request in trace.requests:
        tokens = np.concatenate([request.input_tokens, request.output_tokens])
        hits.append(serve(cache, None, tokens, len(request.input_tokens)))
        _check(cache)
    return hits


def test_the_papers_lru_is_its_declaration() -> None:
    """sglang+, vLLM+ and marconi+'s LRU expert evaluate `LRU` / `LRU_DEEPEST_FIRST`."""
    assert get_system("sglang+").policies(SMALL, 0.0)[1].priority is paper.LRU  # type: ignore[attr-defined]
    assert (get_system("vllm+").policies(SMALL, 0.0)[1].priority  # type: ignore[attr-defined]
            is paper.LRU_DEEPEST_FIRST)
    assert Switchable(SMALL).lru.priority is paper.LRU
    assert declared_priority("sglang+") is None  # (the plugins offer lfu and slru by name)


# a changed LRU: the shallowest leaf first, then the least recently used (recency, depth
# and states only: marconi+'s live cache still runs it compiled)
SHALLOWEST_FIRST = Priority("lru-shallowest-first",
                            keys=(Key(Term(Feature.DEPTH)), Key(Term(Feature.RECENCY))))


@pytest.mark.parametrize("capacity", [1_000_000, 2_000_000])
def test_changing_the_lru_declaration_is_one_change(capacity: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing `paper/eviction.py`'s `LRU` reaches sglang+ and marconi+'s LRU expert on
    both cores, hit for hit; a declaration that counts hits keeps marconi+ on the Python
    core, with the reason."""
    before = {core: replay(_system_cache(core, "sglang+", capacity, monkeypatch))
              for core in CORES}
    for core in CORES:  # marconi+'s LRU expert is sglang+'s order, its stamps its own
        assert replay(_cache(core, capacity, Switchable(SMALL, Mode.LRU), monkeypatch)) \
            == before["python"]
    monkeypatch.setattr(paper, "LRU", SHALLOWEST_FIRST)
    after = {core: replay(_system_cache(core, "sglang+", capacity, monkeypatch))
             for core in CORES}
    expert = {core: replay(_cache(core, capacity, Switchable(SMALL, Mode.LRU), monkeypatch))
              for core in CORES}
    reference = replay(PrefixCache(SMALL, capacity, Judicious(), Ranked(SHALLOWEST_FIRST)))
    for core in CORES:
        assert after[core] == expert[core] == reference
        assert before[core] == before["python"]
    assert reference != before["python"] and sum(reference) > 0
    monkeypatch.setattr(paper, "LRU", LFU)
    plus = Switchable(SMALL)
    reason = compiled_reason(SMALL, Judicious(), plus, Layout())
    assert reason is not None and "Switchable runs in Python only" in reason


@pytest.mark.parametrize("core", CORES)
def test_marconi_plus_lru_expert_reads_its_own_stamps(core: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for two sequences: A, then B, then A again, then C. marconi+ choosing by LRU
    evicts B (touched last before A's second visit); the FLOP expert's stamps, the level
    at a touch, tie A and B (no victim raised the level between) and would evict A."""
    a, b, c = (np.arange(start, start + 100, dtype=np.int32) for start in (0, 1000, 2000))
    cache = _cache(core, 2 * (100 * KV + STATE) + 50 * KV, Switchable(SMALL, Mode.LRU),
                   monkeypatch)
    for tokens in (a, b, a, c):
        serve(cache, None, tokens, len(tokens))
    _check(cache)
    assert [cache.lookup(t).hit for t in (a, b)] == [100, 0]


def _system_cache(core: str, system: str, capacity: int,
                  monkeypatch: pytest.MonkeyPatch) -> PrefixCache:
    monkeypatch.setenv(compiled.CORE_ENV, core)
    admission, policy = get_system(system).policies(SMALL, 0.0)
    cache = replay_cache(SMALL, capacity, admission, policy)
    assert getattr(cache, "compiled", False) == (core == "compiled")
    return cache


def _cache(core: str, capacity: int, eviction: Eviction,
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


@pytest.mark.parametrize("core", CORES)
def test_lfu_breaks_equal_counts_by_its_second_key(core: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A and B committed once each, then A looked up (a touch, not a commit: no count);
    C evicts B, the less recent of two equal counts, where creation order would take A."""
    a, b, c = (np.arange(start, start + 100, dtype=np.int32) for start in (0, 1000, 2000))
    cache = _cache(core, 2 * (100 * KV + STATE) + 50 * KV, Ranked(LFU), monkeypatch)
    serve(cache, None, a, 100)
    serve(cache, None, b, 100)
    assert cache.lookup(a).hit == 100
    serve(cache, None, c, 100)
    _check(cache)
    assert [cache.lookup(t).hit for t in (a, b)] == [100, 0]


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


@pytest.mark.parametrize("priority", [LRU, LFU, SLRU, paper.LRU_DEEPEST_FIRST],
                         ids=lambda p: p.name)
def test_a_key_function_sums_as_key_value_does(priority: Priority) -> None:
    """`key_function` (what the vLLM order calls per candidate) gives `key_value`'s sums,
    a tuple of them, or one key's as a float."""
    values = {Feature.RECENCY: 7.0, Feature.HITS: 2.0, Feature.CREATED: 3.0,
              Feature.DEPTH: 40.0, Feature.STATE: 1.0}
    read = {f: functools.partial(float, v) for f, v in values.items()}
    expected = tuple(key_value(k, values) for k in priority.keys)
    assert key_function(priority.keys, read)() == expected
    one = key_function(priority.keys[:1], read, one_as_float=True)()
    assert one == expected[0] and isinstance(one, float)
    assert key_function((), read, one_as_float=True)() == 0.0


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_keys_by_its_own_books(how: str) -> None:
    """`Ranked.key` is built once over the instance's books: a copy (a shadow's, a
    snapshot's) keys by its own, and the original by its own."""
    cache = PrefixCache(SMALL, 10**9, Judicious(), Ranked(LFU))
    for tokens in (np.arange(50, dtype=np.int32), np.arange(100, 160, dtype=np.int32)):
        serve(cache, None, tokens, len(tokens))
    original = cache.eviction
    assert isinstance(original, Ranked)
    leaf = next(n for n in original._key if not n.children)
    before = original.key(leaf)
    twin = copy.deepcopy(cache) if how == "deepcopy" else pickle.loads(pickle.dumps(cache))
    twin_policy = twin.eviction
    assert isinstance(twin_policy, Ranked)
    twin_leaf = next(n for n in twin_policy._key if n.depth == leaf.depth and not n.children)
    assert twin_policy.key(twin_leaf) == before
    twin_policy.hits[twin_leaf] += 5
    twin_policy.stamp[twin_leaf] = 99
    assert twin_policy.key(twin_leaf) == (before[0] + 5, 99)
    assert original.key(leaf) == before
