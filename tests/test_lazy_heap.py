"""Lazy LRU heaps stay bounded: a node pushed again at an unchanged stamp (a `changed`
call, a path touched twice in one tick) must not pile up valid duplicates, which no
compaction could drop and which made the infinite-cache bound quadratic."""

from __future__ import annotations

import heapq

from marconi.core.lazy_heap import compact, lazy_min
from marconi.core.tree import Node
from marconi.paper.eviction import LRULeaf
from marconi.peers.two_lists import LazyLRU


def _leaf(node_id: int) -> Node:
    root = Node(b"", None, 0)
    leaf = Node(bytes([node_id % 256]), root, node_id)
    root.children[leaf.key] = leaf
    return leaf


def test_compact_keeps_one_entry_per_node_the_one_a_search_finds_first() -> None:
    a, b = _leaf(1), _leaf(2)
    heap = [(5.0, 3, 1, a), (5.0, 1, 1, a), (4.0, 0, 1, a), (7.0, 0, 2, b), (7.0, 0, 2, b)]
    heapq.heapify(heap)
    stamps = {a: 5.0, b: 7.0}
    valid = lambda e: stamps[e[3]] == e[0]  # noqa: E731
    out = compact(heap, valid)
    assert sorted(e[:3] for e in out) == [(5.0, 1, 1), (7.0, 0, 2)]
    assert lazy_min(out, valid, ()) == lazy_min(heap, valid, ())


def test_a_lru_list_stays_bounded_when_a_node_is_pushed_again_and_again() -> None:
    node = _leaf(1)
    lru = LazyLRU({}, lambda n: True, shallow_first=True)
    lru.touch(node, 3)
    for _ in range(500):
        lru.push(node)  # `changed` at an unchanged stamp
    assert len(lru.heap) <= 2 * len(lru.stamps) + 65


def test_the_papers_lru_stays_bounded_too() -> None:
    node = _leaf(1)
    lru = LRULeaf()
    lru.on_commit([node], [node], 3)
    for _ in range(500):
        lru.changed(node)
    assert len(lru._heap) <= 2 * len(lru.stamp) + 65
