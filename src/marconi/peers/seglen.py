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

import numpy as np

from marconi.core.candidates import Scored
from marconi.core.scores import normalized
from marconi.core.tree import Node


def replay_length(node: Node) -> int:
    """Tokens from the nearest ancestor holding a state (the root: none) to `node`."""
    cur = node.parent
    while cur is not None and cur.parent is not None and not cur.has_state:
        cur = cur.parent
    return node.depth - (cur.depth if cur is not None else 0)


class SegLen(Scored):
    """Recency plus `weight` x replay length, both min-max normalized, lowest first.

    Candidates (`Candidates`) carry their last touch; the replay length is read at each
    victim choice, since a state gained or lost above a candidate changes it without the
    candidate itself changing.
    """

    compiled_as = "seglen"  # the compiled core runs it (marconi.core.compiled)

    def __init__(self, weight: float = 0.85) -> None:
        if not weight >= 0:
            raise ValueError(f"SegLen weight must be >= 0, got {weight!r}")
        super().__init__()  # no efficiency column: the replay length needs no model
        self.weight = float(weight)

    def scores(self, now: int) -> np.ndarray:
        """Each candidate's score, in row order."""
        columns = self.columns
        n = len(columns)
        replay = np.array([replay_length(node) for node in columns.nodes], dtype=np.float64)
        return normalized(columns["rec"][:n]) + self.weight * normalized(replay)

