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

from marconi.core.candidates import Candidates
from marconi.core.policy import Eviction, Victim
from marconi.core.scores import normalized
from marconi.core.tree import Node


def replay_length(node: Node) -> int:
    """Tokens from the nearest ancestor holding a state (the root: none) to `node`."""
    cur = node.parent
    while cur is not None and cur.parent is not None and not cur.has_state:
        cur = cur.parent
    return node.depth - (cur.depth if cur is not None else 0)


class SegLen(Eviction):
    """Recency plus `weight` x replay length, both min-max normalized, lowest first.

    Candidates (`Candidates`) carry their last touch; the replay length is read at each
    victim choice, since a state gained or lost above a candidate changes it without the
    candidate itself changing.
    """

    def __init__(self, weight: float = 0.85) -> None:
        super().__init__()
        if not weight >= 0:
            raise ValueError(f"SegLen weight must be >= 0, got {weight!r}")
        self.weight = float(weight)
        self.candidate_set = Candidates(self.stamp)  # the replay length needs no model
        self.slots = self.candidate_set.slots

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        if hit is not None:
            self.stamp[hit] = now
            self.candidate_set.update(hit)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = now
            self.candidate_set.update(node)

    def changed(self, node: Node) -> None:
        self.candidate_set.update(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.candidate_set.discard(node)

    def scores(self) -> np.ndarray:
        """Each candidate's score, in slot order."""
        slots = self.slots
        n = len(slots)
        replay = np.array([replay_length(node) for node in slots.nodes], dtype=np.float64)
        return normalized(slots["rec"][:n]) + self.weight * normalized(replay)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if not self.slots:
            return None
        slot = self.candidate_set.lowest(self.scores(), protected)
        return self.candidate_set.victim(slot) if slot is not None else None

    def check(self, nodes: Sequence[Node]) -> None:
        self.candidate_set.check(nodes)
