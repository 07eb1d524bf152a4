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

from marconi.core.candidates import Declared
from marconi.core.candidates import replay_length as replay_length  # (re-exported)
from marconi.core.priority import Feature, Score, Term


def seglen_score(weight: float) -> Score:
    """SegLen's order at `weight`, declared: recency plus `weight` x replay length."""
    return Score("seglen", terms=(Term(Feature.RECENCY), Term(Feature.REPLAY, weight=weight)),
                 description="last touch + weight x replay length, each min-max "
                             "normalized over the candidates, lowest first")


class SegLen(Declared):
    """Recency plus `weight` x replay length, both min-max normalized, lowest first
    (`seglen_score`), evaluated as `Declared` evaluates any score: the replay length is
    read at each victim choice, since a state gained or lost above a candidate changes it
    without the candidate itself changing."""

    compiled_as = "scored"  # the compiled core evaluates its score (marconi.core.compiled)

    def __init__(self, weight: float = 0.85) -> None:
        if not weight >= 0:
            raise ValueError(f"SegLen weight must be >= 0, got {weight!r}")
        super().__init__(seglen_score(float(weight)))  # no model: the replay length needs none
        self.weight = float(weight)
