from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi.core.tree import RadixTree, first_mismatch
from tests.helpers import examples


def _key(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


def _make_tree(*seqs: list[int]) -> RadixTree:
    """Insert each sequence the way the cache does: split where it leaves, hang the tail."""
    tree = RadixTree()
    for seq in seqs:
        key = _key(seq)
        m = tree.match(key)
        parent = m.node or tree.root
        if m.partial is not None:
            parent = tree.split(m.partial, m.offset) if m.offset else parent
        if m.length < len(seq):
            tree.insert(parent, key[4 * m.length :])
    return tree


class TestMatch:
    def test_empty_tree(self) -> None:
        m = RadixTree().match(_key([1, 2, 3]))
        assert (m.path, m.partial, m.length) == ((), None, 0)

    def test_full_and_partial(self) -> None:
        tree = _make_tree([1, 2, 3, 4], [1, 2, 9])
        m = tree.match(_key([1, 2, 3, 7]))
        assert [n.depth for n in m.path] == [2]
        assert m.partial is not None and m.partial.depth == 4
        assert (m.offset, m.length) == (1, 3)

    def test_input_ends_inside_an_edge(self) -> None:
        tree = _make_tree([5, 6, 7, 8])
        m = tree.match(_key([5, 6]))
        assert m.path == () and m.partial is not None and m.length == 2

    def test_first_mismatch(self) -> None:
        assert first_mismatch(_key([1, 2, 3]), _key([1, 2, 4])) == 2
        assert first_mismatch(_key([1, 2]), _key([1, 2, 3])) == 2


class TestStructure:
    def test_split_keeps_identity_of_the_tail(self) -> None:
        tree = _make_tree([1, 2, 3, 4])
        (node,) = tree.root.children.values()
        head = tree.split(node, 1)
        assert head.depth == 1 and node.depth == 4 and node.parent is head
        assert node.tokens().tolist() == [2, 3, 4]
        tree.check()

    def test_split_bounds(self) -> None:
        tree = _make_tree([1, 2])
        (node,) = tree.root.children.values()
        with pytest.raises(ValueError, match="outside edge"):
            tree.split(node, 2)

    def test_merge_into_child(self) -> None:
        tree = _make_tree([1, 2, 3], [1, 2, 3, 4, 5])
        (top,) = tree.root.children.values()
        child = tree.merge_into_child(top)
        assert child.depth == 5 and child.tokens().tolist() == [1, 2, 3, 4, 5]
        assert tree.size == 1
        tree.check()

    def test_merge_needs_one_child(self) -> None:
        tree = _make_tree([1, 2])
        (leaf,) = tree.root.children.values()
        with pytest.raises(ValueError, match="exactly one child"):
            tree.merge_into_child(leaf)

    def test_remove_leaf_only(self) -> None:
        tree = _make_tree([1, 2, 3], [1, 2, 4])
        (top,) = tree.root.children.values()
        with pytest.raises(ValueError, match="not a removable leaf"):
            tree.remove_leaf(top)
        leaf = next(iter(top.children.values()))
        tree.remove_leaf(leaf)
        assert tree.size == 2
        tree.check()

    def test_insert_refuses_existing_first_token(self) -> None:
        tree = _make_tree([1, 2])
        with pytest.raises(ValueError, match="new token"):
            tree.insert(tree.root, _key([1, 5]))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=12))
def test_every_inserted_sequence_matches_in_full(seqs: list[list[int]]) -> None:
    tree = _make_tree(*seqs)
    tree.check()
    for seq in seqs:
        m = tree.match(_key(seq))
        assert m.length == len(seq)
        spelled = b"".join(n.key for n in m.path) + (
            m.partial.key[: 4 * m.offset] if m.partial is not None else b"")
        assert spelled == _key(seq)


def test_every_change_of_shape_bumps_the_version() -> None:
    """A commit resumes its lookup's walk only while `version` is unchanged: each method
    that changes the tree's shape must bump it (a missed bump resumes a stale path)."""
    tree = RadixTree()
    seen = [tree.version]

    def bumped() -> bool:
        seen.append(tree.version)
        return seen[-1] > seen[-2]

    a = tree.insert(tree.root, _key(list(range(10))))
    assert bumped()
    head = tree.split(a, 4)
    assert bumped()
    tree.namespace("salted")
    assert bumped()
    tree.namespace("salted")  # exists: nothing changes
    assert not bumped()
    tree.merge_into_child(head)
    assert bumped()
    tree.remove_leaf(a)
    assert bumped()
    tree.match(_key(list(range(3))))
    assert not bumped()
