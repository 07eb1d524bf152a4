"""GreedyDual-FLOP: GreedyDual-Size (Young's Landlord) with the FLOPs a node saves as its
cost, over Marconi's candidates (nodes with at most one child).

S(v) = L(v) + eff(v), unnormalized, where L(v) is the inflation level when v was last
touched and every victim raises the level to its own score. Entries age out as the level
passes them, efficient ones later; the order is scale-free, so there is no alpha to tune.
"""

from __future__ import annotations

import numpy as np

from marconi.core.spec import ModelSpec
from marconi.paper.eviction import FlopAware


class GreedyDualFlop(FlopAware):
    """FLOP-aware candidates and efficiency; recency is GreedyDual's inflation level."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec, 0.0)
        self.level = 0.0  # inflation level: the score of the last victim (never falls)

    def _time(self, now: int) -> float:
        return self.level

    def fresh(self, alpha: float) -> GreedyDualFlop:
        return GreedyDualFlop(self.spec)

    def scores(self, now: int) -> np.ndarray:
        n = len(self.slots)
        return self.slots["rec"][:n] + self.slots["eff"][:n]

    def _chose(self, score: float) -> None:
        self.level = max(self.level, score)

    def follow(self, now: int) -> None:
        """Raise the level to where this policy's own victim would put it, when another
        policy chose the victim (so that a switch to this one finds a live recency order;
        frozen at 0, it would rank by efficiency alone until the level caught up)."""
        if self.slots:
            self.level = max(self.level, float(self.scores(now).min()))
