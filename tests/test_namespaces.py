"""Cache-key namespaces (`salt=`): two namespaces never share an entry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi.core.integrity import check_integrity
from marconi.core.snapshot import rebuild, take
from marconi.core.tree import Node
from marconi.systems import make_cache
from tests.helpers import CACHES, SMALL, ListStore, examples

SALTS = [None, "lora-a", b"tenant", 7]


def _prefixes(cache, salt) -> list[list[int]]:
    """Brute force: the prefix of every node with a state under namespace `salt`'s root."""
    root = cache.tree.roots.get(salt)
    out = []
    for node in cache.tree.nodes():
        path = cache.path(node)
        if node.has_state and path[0].parent is root:
            out.append([t for n in path for t in n.tokens().tolist()])
    return out


def _hit(prefixes: list[list[int]], inp: list[int], limit: int) -> int:
    return max((len(p) for p in prefixes if len(p) <= limit and inp[: len(p)] == p), default=0)


class TestSeparation:
    @pytest.mark.parametrize("system", sorted(set(CACHES) - {"vanilla"}))
    def test_a_sequence_hits_only_in_its_own_namespace(self, system):
        cache = make_cache(SMALL, "1TB", system)
        seq = list(range(200))
        for _ in range(3):  # requests: a system that learns where reuse is sees some first
            cache.lookup(seq, salt="a")
            cache.commit([*seq, 1], 200, salt="a")
        assert cache.lookup([*seq, 1, 2], salt="a").hit > 0
        for other in (None, "b", b"a", 0):
            plan = cache.lookup([*seq, 1, 2], salt=other)
            assert (plan.hit, plan.matched, plan.node) == (0, 0, None)
        check_integrity(cache)

    def test_an_emptied_namespace_is_dropped(self):
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit([1, 2, 3], 3, salt="a")
        assert "a" in cache.tree.roots
        cache.evict(cache.bytes)
        assert set(cache.tree.roots) == {None}
        check_integrity(cache)

    def test_a_bad_salt_names_the_field(self):
        cache = make_cache(SMALL, "1TB", "marconi")
        for bad in ([1], 1.5, True):
            with pytest.raises(ValueError, match="salt"):
                cache.commit([1, 2], 2, salt=bad)
        with pytest.raises(ValueError, match="salt"):
            cache.lookup([1, 2], salt={"a": 1})


@settings(max_examples=examples(80), deadline=None)
@given(system=st.sampled_from(sorted(CACHES)), capacity=st.integers(100_000, 600_000),
       requests=st.lists(st.tuples(st.sampled_from(SALTS),
                                   st.lists(st.integers(0, 3), min_size=1, max_size=12),
                                   st.lists(st.integers(0, 3), max_size=4)),
                         min_size=1, max_size=25))
def test_hits_come_from_the_lookups_namespace_only(system, capacity, requests):
    """Every hit equals the brute-force hit over that namespace's states alone, under
    evictions that cross namespaces."""
    cache = make_cache(SMALL, capacity, system, store=ListStore())
    for salt, inp, out in requests:
        expected = _hit(_prefixes(cache, salt), inp, cache.admission.max_hit(len(inp)))
        plan = cache.lookup(inp, salt=salt)
        assert plan.hit == expected
        if plan.node is not None:
            assert cache.path(plan.node)[0].parent is cache.tree.roots[salt]
        full = inp + out
        states = {p: ("s", p) for p in cache.required_states(full, len(inp), salt=salt)}
        cache.commit(full, len(inp), states=states, kv=full, salt=salt)
        check_integrity(cache)


def test_a_snapshot_keeps_namespaces():
    """The tuner's replays start from a snapshot: namespaces survive the round trip."""
    cache = make_cache(SMALL, "1TB", "marconi")
    for salt in SALTS:
        cache.commit([1, 2, 3, 4, 5], 5, salt=salt)
    cache.commit([1, 2, 9], 3, salt="lora-a")
    copy = make_cache(SMALL, "1TB", "marconi")
    nodes: list[Node] = rebuild(take(cache), copy)
    assert len(nodes) == cache.tree.size
    assert (copy.stats.kv_bytes, copy.stats.states) == (cache.stats.kv_bytes, cache.stats.states)
    for salt in SALTS:
        assert sorted(_prefixes(copy, salt)) == sorted(_prefixes(cache, salt))
    check_integrity(copy)
