"""Exact values the mutation pass (benchmarks/bench_mutation.py) found no test asserting:
unpin really unpins, evict(0) frees nothing and evict returns what it freed, a merged-away
node is detached, required_states reads the namespace it is given, a node's repr."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.integrity import check_integrity
from marconi.core.tree import RadixTree
from marconi.systems import make_cache
from tests.helpers import SMALL

ENTRY = 20 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes  # one 20-token sequence, one state


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _key(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


class TestPins:
    def test_unpin_undoes_pin_and_the_entry_can_leave(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20)
        node = cache.lookup(_seq(0, 20)).node
        cache.pin(node)
        cache.pin(node)
        cache.unpin(node)
        assert node is not None and node.pins == 1 and cache.evict(ENTRY) == 0
        cache.unpin(node)
        assert node.pins == 0 and cache.pinned == set()
        assert cache.evict(ENTRY) == ENTRY and cache.bytes == 0
        check_integrity(cache)


class TestEvict:
    def test_evict_zero_frees_nothing_and_evict_returns_what_it_freed(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        for start in (0, 1000, 2000):
            cache.commit(_seq(start, 20), 20)
        assert cache.evict(0) == 0 and cache.bytes == 3 * ENTRY
        assert cache.evict(1) == ENTRY and cache.bytes == 2 * ENTRY  # one whole entry
        assert cache.evict(ENTRY + 1) == 2 * ENTRY and cache.stats.evictions == 3


class TestRequiredStates:
    def test_each_namespace_has_its_own_states(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20, salt="a")
        assert cache.required_states(_seq(0, 20), 20, salt="a") == ()
        assert cache.required_states(_seq(0, 20), 20) == (20,)

    def test_errors_name_the_call(self) -> None:
        with pytest.raises(ValueError, match="required_states: empty token list"):
            make_cache(SMALL, "1TB", "sglang+").required_states([], 0)


class TestTree:
    def test_a_merged_node_is_detached(self) -> None:
        tree = RadixTree()
        top = tree.insert(tree.root, _key([1, 2, 3]))
        child = tree.insert(top, _key([4, 5]))
        assert tree.merge_into_child(top) is child
        assert top.parent is None and top.children == {}

    def test_repr_names_id_depth_edge_and_state(self) -> None:
        tree = RadixTree()
        node = tree.insert(tree.root, _key([1, 2, 3]))
        assert repr(node) == f"Node(id={node.id}, depth=3, edge=3)"
        node.has_state = True
        assert repr(node) == f"Node(id={node.id}, depth=3, edge=3 state)"
