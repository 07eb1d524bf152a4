"""`Slots`: eviction candidates packed in dense numpy columns, for vectorized scoring.

A policy that scores every candidate for every victim (through `Candidates`: FlopAware,
HitDensity, GreedyDual-FLOP, SegLen; the offline reference) keeps one slot per candidate
and one numpy column per attribute; removing a candidate moves the last one into its
slot, so `[:len(slots)]` of every column is always the live candidates, in the order of
`nodes`.

```
nodes   [ a  b  c  d ]        drop(b)  ->   [ a  d  c ]
rec     [ 3  7  5  9 ]                      [ 3  9  5 ]
index   {a: 0, b: 1, c: 2, d: 3}            {a: 0, d: 1, c: 2}
```
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from marconi.core.tree import Node


class Slots:
    """A dense set of nodes with one numpy column per attribute."""

    def __init__(self, columns: Mapping[str, npt.DTypeLike]) -> None:
        self.nodes: list[Node] = []
        self.index: dict[Node, int] = {}
        self._columns = {name: np.zeros(64, dtype=dtype) for name, dtype in columns.items()}

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self.index

    def __getitem__(self, name: str) -> np.ndarray:
        """The column `name`, full length: slice `[:len(self)]` for the live candidates."""
        return self._columns[name]

    def add(self, node: Node) -> int:
        """Give `node` the next slot (growing every column when full); returns the slot."""
        slot = len(self.nodes)
        if slot == len(next(iter(self._columns.values()))):
            for name, column in self._columns.items():
                self._columns[name] = np.resize(column, 2 * slot)
        self.nodes.append(node)
        self.index[node] = slot
        return slot

    def drop(self, node: Node) -> None:
        """Remove `node`; the last candidate moves into its slot."""
        slot = self.index.pop(node)
        last = self.nodes.pop()
        if last is not node:
            n = len(self.nodes)
            self.nodes[slot] = last
            self.index[last] = slot
            for column in self._columns.values():
                column[slot] = column[n]
