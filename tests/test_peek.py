"""`PrefixCache.peek`: the plan a lookup would return, with no side effect at all."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from marconi.systems import make_cache
from tests.helpers import CACHES, SMALL


def _history(system: str):
    """A cache with shared prefixes, branches, partial hits and evictions behind it."""
    # vLLM keeps fewer states (its replay boundaries): a smaller cache evicts there too;
    # SGLang's extra buffer holds two tracking slots beside its states: a larger one
    # (an engine's "+marconi" variant sizes as the engine does)
    room = {"vllm-2026": (3, 200), "sglang-2026-extra": (10, 400)}.get(
        system.split("+")[0], (6, 400))
    cache = make_cache(SMALL, room[0] * SMALL.ssm_bytes + room[1] * SMALL.kv_bytes_per_token,
                       system)
    rng = np.random.default_rng(0)
    head = list(range(100, 160))
    for i in range(40):
        inp = head[: 20 + 10 * (i % 5)] + rng.integers(0, 50, 8).tolist()
        cache.lookup(inp, boundaries=(20,))
        cache.commit([*inp, i], len(inp), boundaries=(20,))
    return cache, head


PROBES = [[*range(100, 150), 1, 2], [*range(100, 125), 7], [5, 6, 7]]


@pytest.mark.parametrize("system", sorted(CACHES))
def test_peek_leaves_the_cache_byte_for_byte_unchanged(system):
    cache, _ = _history(system)
    assert cache.stats.evictions > 0 or system == "vanilla"
    before = pickle.dumps(cache)
    for probe in PROBES * 3:  # repeated: a policy that learned from a probe would show it
        cache.peek(probe, boundaries=(20,))
    assert pickle.dumps(cache) == before


@pytest.mark.parametrize("system", sorted(CACHES))
def test_peek_plans_what_lookup_then_returns(system):
    cache, _ = _history(system)
    for probe in PROBES:
        seen = cache.peek(probe, boundaries=(20,))
        assert cache.lookup(probe, boundaries=(20,)) == seen


def test_peek_validates_like_lookup():
    cache = make_cache(SMALL, "1GB", "marconi")
    with pytest.raises(ValueError, match="peek"):
        cache.peek([])
    with pytest.raises(ValueError, match="salt"):
        cache.peek([1, 2], salt=[1])


def test_a_learning_admission_learns_nothing_from_a_peek():
    """Structured admission counts partial-hit sightings on lookup (a checkpoint on the
    second); peeks must not count, yet say what the lookup will plan."""
    from marconi.core.cache import PrefixCache
    from marconi.paper.eviction import LRULeaf
    from marconi.plus.admission import StructureConfig, Structured

    cache = PrefixCache(SMALL, "1TB", Structured(StructureConfig(min_gain=0.0)), LRULeaf())
    cache.commit(list(range(40)), 40)
    probe = list(range(30))  # ends inside the edge: KV matched to 30, no state there
    before = pickle.dumps(cache)
    assert [cache.peek(probe).checkpoints for _ in range(3)] == [(), (), ()]
    assert pickle.dumps(cache) == before
    assert cache.lookup(probe).checkpoints == ()  # the first sighting
    assert cache.peek(probe).checkpoints == (30,) == cache.lookup(probe).checkpoints
