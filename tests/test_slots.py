"""`Slots`: the dense candidate columns every scored eviction policy shares, against a
plain dict of the same rows under random adds and drops."""

from __future__ import annotations

import numpy as np

from marconi.core.slots import Slots
from marconi.core.tree import RadixTree


def test_matches_a_dict_under_random_adds_and_drops() -> None:
    tree = RadixTree()
    nodes = [tree.insert(tree.root, np.array([i, i + 1], dtype=np.int32).tobytes())
             for i in range(0, 400, 2)]
    slots = Slots({"x": np.float64, "k": np.intp})
    reference: dict[object, tuple[float, int]] = {}
    rng = np.random.default_rng(0)
    for step in range(3000):
        node = nodes[int(rng.integers(len(nodes)))]
        if node in slots and rng.random() < 0.5:
            slots.drop(node)
            del reference[node]
        else:
            slot = slots.index.get(node)
            slot = slots.add(node) if slot is None else slot
            slots["x"][slot], slots["k"][slot] = step / 7, step
            reference[node] = (step / 7, step)
        n = len(slots)
        assert n == len(reference) and set(slots.nodes) == set(reference)
        for i, member in enumerate(slots.nodes):
            assert slots.index[member] == i
            assert (slots["x"][i], slots["k"][i]) == reference[member]
        assert slots["k"].dtype == np.intp and len(slots["x"]) >= n
