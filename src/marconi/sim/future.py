"""The trace's future, for the offline reference (`sim/offline.py`).

`FutureIndex` is a radix tree over every request's input, built in one pass. Each node
lists (ascending) the requests whose input covers its whole edge; an input that ends
inside an edge splits it, so the requests whose input starts with a prefix `P` are
exactly the list of the node whose edge holds the end of `P`.

```
inputs:   r0 = |sys|a......|       r1 = |sys|b....|      r2 = |sys|a......|c..|
tree:     (sys: r0 r1 r2) -> (a......: r0 r2) -> (c..: r2)
                          -> (b....: r1)
```
`now` is the request being served: "next use" means the first listed request after it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from marconi.core.tree import TOKEN_BYTES, Node, RadixTree, first_mismatch

Uses = list[int]  # ascending request indices


class FutureIndex:
    def __init__(self, inputs: Sequence[np.ndarray]) -> None:
        self.tree = RadixTree()
        self.uses: dict[Node, Uses] = {}
        self.now = 0  # the request being served
        for i, tokens in enumerate(inputs):
            self._add(i, tokens.tobytes())

    def _add(self, i: int, key: bytes) -> None:
        match = self.tree.match(key)
        path = list(match.path)
        if match.partial is not None:  # ends or leaves mid-edge: cut the edge there
            head = self.tree.split(match.partial, match.offset)
            self.uses[head] = list(self.uses[match.partial])
            path.append(head)
        if match.length * TOKEN_BYTES < len(key):
            parent = path[-1] if path else self.tree.root
            path.append(self.tree.insert(parent, key[match.length * TOKEN_BYTES :]))
        for node in path:
            self.uses.setdefault(node, []).append(i)

    def uses_of(self, key: bytes) -> Uses:
        """Requests whose input starts with `key` (int32 bytes), ascending."""
        if not key:
            return []
        match = self.tree.match(key)
        if match.length * TOKEN_BYTES < len(key):
            return []  # no input spells all of it
        node = match.partial if match.partial is not None else match.node
        return self.uses[node] if node is not None else []

    def next_use(self, uses: Uses, exclude: Sequence[int] = ()) -> int | None:
        """First request after `now` in `uses` that is not in `exclude`; None: never."""
        k = bisect_right(uses, self.now)
        for j in uses[k : k + 64]:  # the first few suffice: exclusions cluster
            if not _contains(exclude, j):
                return j
        return uses[k + 64] if len(uses) > k + 64 else None

    def reuse_points(self, key: bytes) -> list[int]:
        """Depths of `key` at which some later request's input leaves it (their longest
        common prefix with `key`): where a state would be hit, ascending."""
        out, node, pos = [], self.tree.root, 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            end = pos + len(child.key)
            if key[pos:end] != child.key:  # ends or leaves inside the edge
                depth = pos // TOKEN_BYTES + first_mismatch(child.key, key[pos:end])
                if self._later(child) and depth > pos // TOKEN_BYTES:
                    out.append(depth)
                break
            following = node_after(child, key, end)
            if self._later(child) > (self._later(following) if following else 0):
                out.append(end // TOKEN_BYTES)
            node, pos = child, end
        return out

    def shared_depth(self, key: bytes, at_least: int = 2) -> int:
        """Deepest depth (tokens) of `key` whose prefix at least `at_least` requests after
        `now` start with: where a branch checkpoint placed by the first would be hit."""
        node, pos = self.tree.root, 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None or self._later(child) < at_least:
                break
            end = pos + len(child.key)
            if key[pos:end] != child.key:  # leaves inside the edge
                return pos // TOKEN_BYTES + first_mismatch(child.key, key[pos:end])
            node, pos = child, end
        return pos // TOKEN_BYTES

    def _later(self, node: Node) -> int:
        uses = self.uses[node]
        return len(uses) - bisect_right(uses, self.now)


def node_after(node: Node, key: bytes, pos: int) -> Node | None:
    """The child of `node` that `key` continues into at byte offset `pos`, if any."""
    return node.children.get(key[pos : pos + TOKEN_BYTES]) if pos < len(key) else None


def _contains(sorted_list: Sequence[int], x: int) -> bool:
    k = bisect_right(sorted_list, x)
    return k > 0 and sorted_list[k - 1] == x
