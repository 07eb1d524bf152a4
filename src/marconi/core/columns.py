"""`Columns`: eviction candidates packed in dense numpy columns, for vectorized scoring.

A policy that scores every candidate for every victim (through `Candidates`: FlopAware,
HitDensity, GreedyDual-FLOP, SegLen; the offline reference) keeps one row per candidate
and one numpy column per attribute; removing a candidate moves the last one into its
row, so `[:len(columns)]` of every column is always the live candidates, in the order of
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


class Columns:
    """A dense set of nodes with one numpy column per attribute."""

    def __init__(self, columns: Mapping[str, npt.DTypeLike]) -> None:
        self.nodes: list[Node] = []
        self.index: dict[Node, int] = {}
        self._arrays = {name: np.zeros(64, dtype=dtype) for name, dtype in columns.items()}

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self.index

    def __getitem__(self, name: str) -> np.ndarray:
        """The column `name`, full length: slice `[:len(self)]` for the live candidates."""
        return self._arrays[name]

    def add(self, node: Node) -> int:
        """Give `node` the next row (growing every column when full); returns the row."""
        row = len(self.nodes)
        if row == len(next(iter(self._arrays.values()))):
            for name, column in self._arrays.items():
                self._arrays[name] = np.resize(column, 2 * row)
        self.nodes.append(node)
        self.index[node] = row
        return row

    def drop(self, node: Node) -> None:
        """Remove `node`; the last candidate moves into its row."""
        row = self.index.pop(node)
        last = self.nodes.pop()
        if last is not node:
            n = len(self.nodes)
            self.nodes[row] = last
            self.index[last] = row
            for column in self._arrays.values():
                column[row] = column[n]
