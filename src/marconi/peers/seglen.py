"""SegLen: a model-agnostic stand-in for Marconi's FLOP-efficiency term (docs/peers.md,
"Other baselines").

Marconi scores a candidate `recency + alpha x FLOPs saved per byte`, which needs the
model's cost formula. SegLen keeps the shape and replaces the efficiency by the replay
length: the tokens a hit would have to recompute if the candidate left, i.e. from the
nearest ancestor holding a state to the candidate. Longer replays are kept longer.

    score(v) = minmax(last touch) + weight x minmax(replay length), lowest evicted

Candidates, touches and the victim's action are Marconi's (as `FlopAware`): unpinned nodes
with at most one child; a lookup touches only the node it resumes from, a commit stamps
the nodes it creates; a leaf is removed, a one-child node merged into its child.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from marconi.core.policy import Action, Eviction, Victim, alive
from marconi.core.scores import normalized
from marconi.core.slots import Slots
from marconi.core.tree import Node


def replay_length(node: Node) -> int:
    """Tokens from the nearest ancestor holding a state (the root: none) to `node`."""
    cur = node.parent
    while cur is not None and cur.parent is not None and not cur.has_state:
        cur = cur.parent
    return node.depth - (cur.depth if cur is not None else 0)


class SegLen(Eviction):
    """Recency plus `weight` x replay length, both min-max normalized, lowest first.

    Candidates live in `Slots` with their last touch; the replay length is read at each
    victim choice, since a state gained or lost above a candidate changes it without the
    candidate itself changing.
    """

    def __init__(self, weight: float = 0.85) -> None:
        super().__init__()
        if not weight >= 0:
            raise ValueError(f"SegLen weight must be >= 0, got {weight!r}")
        self.weight = float(weight)
        self.slots = Slots({"rec": np.float64})

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        if hit is not None:
            self.stamp[hit] = now
            self.changed(hit)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = now
            self.changed(node)

    def changed(self, node: Node) -> None:
        slots = self.slots
        if alive(node) and not node.pins and len(node.children) <= 1:
            slot = slots.index.get(node)
            if slot is None:
                slot = slots.add(node)
            slots["rec"][slot] = self.stamp.get(node, 0)
        elif node in slots:
            slots.drop(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        if node in self.slots:
            self.slots.drop(node)

    def scores(self) -> np.ndarray:
        """Each candidate's score, in slot order."""
        slots = self.slots
        n = len(slots)
        replay = np.array([replay_length(node) for node in slots.nodes], dtype=np.float64)
        return normalized(slots["rec"][:n]) + self.weight * normalized(replay)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        slots = self.slots
        if not slots:
            return None
        score = self.scores()
        for node in protected:
            slot = slots.index.get(node)
            if slot is not None:
                score[slot] = np.inf
        slot = int(np.argmin(score))
        if not np.isfinite(score[slot]):
            return None
        node = slots.nodes[slot]
        return Victim(node, Action.REMOVE if node.is_leaf else Action.MERGE)

    def check(self, nodes: Sequence[Node]) -> None:
        expected = {n for n in nodes if not n.pins and len(n.children) <= 1}
        got = set(self.slots.nodes)
        assert got == expected, f"candidates differ: extra {got - expected}, " \
                                f"missing {expected - got}"
        for node in got:
            assert self.slots["rec"][self.slots.index[node]] == self.stamp.get(node, 0), (
                f"stale recency for {node!r}")
