"""`Candidates`: Marconi's candidate set, the books every scored eviction shares: who is a
candidate as the tree changes, the victim under a score array, and `check` catching
stale books."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.candidates import Candidates, Efficiency
from marconi.core.policy import Action, Victim
from marconi.core.tree import Node, RadixTree
from tests.helpers import SMALL


def _key(tokens: list[int]) -> bytes:
    return np.array(tokens, dtype=np.int32).tobytes()


def _books() -> tuple[Candidates, RadixTree, list[Node]]:
    tree = RadixTree()
    nodes = [tree.insert(tree.root, _key([i, i + 1, i + 2])) for i in range(0, 12, 3)]
    stamp: dict[Node, float] = {}
    books = Candidates(stamp, Efficiency(SMALL))
    for t, node in enumerate(nodes):
        stamp[node] = t
        books.update(node)
    return books, tree, nodes


class TestMembership:
    def test_a_node_leaves_at_two_children_or_a_pin_and_comes_back(self) -> None:
        books, tree, nodes = _books()
        parent = nodes[0]
        tree.insert(parent, _key([50]))
        tree.insert(parent, _key([60]))
        assert books.update(parent) is None and parent not in books
        nodes[1].pins += 1
        assert books.update(nodes[1]) is None and nodes[1] not in books
        nodes[1].pins -= 1
        row = books.update(nodes[1])
        assert row is not None and books.columns.nodes[row] is nodes[1]
        assert books.columns["eff"][row] == Efficiency(SMALL)(nodes[1])

    def test_discard_is_harmless_twice(self) -> None:
        books, _, nodes = _books()
        books.discard(nodes[2])
        books.discard(nodes[2])
        assert set(books.nodes()) == {nodes[0], nodes[1], nodes[3]}


class TestVictim:
    def test_lowest_skips_protected_and_none_when_all_are(self) -> None:
        books, _, nodes = _books()
        score = books.columns["rec"][:len(books)].copy()  # oldest first
        row = books.lowest(score.copy(), {nodes[0]})
        assert row is not None and books.victim(row) == Victim(nodes[1], Action.REMOVE)
        assert books.lowest(score.copy(), set(nodes)) is None

    def test_a_one_child_node_is_merged(self) -> None:
        books, tree, nodes = _books()
        tree.insert(nodes[0], _key([70]))
        row = books.update(nodes[0])
        assert row is not None and books.victim(row).action is Action.MERGE


class TestCheck:
    def test_catches_a_stale_stamp_and_a_missed_change(self) -> None:
        books, tree, nodes = _books()
        books.check(tree.nodes())
        books.stamp[nodes[1]] = 99  # stamped, the change not reported
        with pytest.raises(AssertionError, match="stale recency"):
            books.check(tree.nodes())
        books.update(nodes[1])
        tree.insert(nodes[2], _key([80]))
        tree.insert(nodes[2], _key([90]))  # two children: no longer a candidate
        with pytest.raises(AssertionError, match="candidates differ"):
            books.check(tree.nodes())
