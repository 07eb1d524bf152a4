"""`Columns`: the dense candidate columns every scored eviction policy shares, against a
plain dict of the same rows under random adds and drops."""

from __future__ import annotations

import numpy as np

from marconi.core.columns import Columns
from marconi.core.tree import RadixTree


def test_matches_a_dict_under_random_adds_and_drops() -> None:
    tree = RadixTree()
    nodes = [tree.insert(tree.root, np.array([i, i + 1], dtype=np.int32).tobytes())
             for i in range(0, 400, 2)]
    columns = Columns({"x": np.float64, "k": np.intp})
    reference: dict[object, tuple[float, int]] = {}
    rng = np.random.default_rng(0)
    for step in range(3000):
        node = nodes[int(rng.integers(len(nodes)))]
        if node in columns and rng.random() < 0.5:
            columns.drop(node)
            del reference[node]
        else:
            row = columns.index.get(node)
            row = columns.add(node) if row is None else row
            columns["x"][row], columns["k"][row] = step / 7, step
            reference[node] = (step / 7, step)
        n = len(columns)
        assert n == len(reference) and set(columns.nodes) == set(reference)
        for i, member in enumerate(columns.nodes):
            assert columns.index[member] == i
            assert (columns["x"][i], columns["k"][i]) == reference[member]
        assert columns["k"].dtype == np.intp and len(columns["x"]) >= n
