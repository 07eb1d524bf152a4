"""`Placed`: a declared `Placement` (marconi.core.priority) run on the Python core.

Where an admission that only places states puts them, read from the declaration and
nothing else (docs/architecture.md, "Admission"):

```
tree:  |---- shared ----|-- old continuation --|
input: |---- shared ----|-- new continuation ------|
                        ^ branch point (inserting the input splits the edge here)
blocks (every=32):  | 32 | 64 | 96 |100|      the final partial block [96, 100) keeps a
                                              state, and grows in place when a later
                                              sequence extends it
```
"""

from __future__ import annotations

from collections.abc import Sequence

from marconi.core.policy import Admission
from marconi.core.priority import Placement
from marconi.core.tree import Match, Node


def branch_point(match: Match, n_tokens: int) -> int | None:
    """Where a sequence of `n_tokens` leaves the tree at a new or stateless branch (the
    drawing above). A sequence that ends inside an edge, or follows the tree to its end,
    branches nowhere."""
    if match.length >= n_tokens:
        return None
    if match.partial is not None:
        return match.length  # leaves mid-edge: the insertion creates this node
    node = match.node
    if node is not None and not node.has_state and node.children:
        return match.length  # an existing branch node that lost (or never had) its state
    return None


class Placed(Admission):
    """States where `placement` puts them (a branch inside the output, where the output
    leaves an existing edge, is admitted at commit too, as the paper's artifact does)."""

    compiled_as = "placed"  # the compiled core evaluates the declaration
    placement: Placement

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    @property
    def caches(self) -> bool:  # type: ignore[override]
        return self.placement.caches

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        placement, points = self.placement, set()
        if placement.branch:
            p = branch_point(match, n_input)
            if p is not None and p > hit:
                points.add(p)
        if placement.every:
            block = placement.every
            points.update(range((hit // block + 1) * block, n_input + 1, block))
        return tuple(sorted(points))

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        placement, points = self.placement, set()
        if placement.branch:
            p = branch_point(match, n_total)
            if p is not None:
                points.add(p)
        if placement.every:
            points.update(range(placement.every, n_total + 1, placement.every))
        if placement.end:
            points.add(n_total)
        return tuple(sorted(points))

    def superseded(self, path: Sequence[Node], n_total: int) -> tuple[Node, ...]:
        """An earlier sequence's final partial block that this one extends grows in place
        (its state moves to the block's new end) instead of staying behind as an interior
        node with a state, as in the paper's artifact:

        ```
        before:  | 32 | 64 | 96 |100|            states at 32, 64, 96, 100
        commit:  | 32 | 64 | 96 |100| 128 | 150  states at 128, 150 added
        after:   | 32 | 64 | 96 ---- 128 | 150  the partial block [96, 100) grew
        ```
        """
        block = self.placement.every
        if not block:
            return ()
        return tuple(n for n in path if n.has_state and n.depth % block and n.depth < n_total)
