"""GreedyDual-FLOP: GreedyDual-Size (Young's Landlord) with the FLOPs a node saves as its
cost, over Marconi's candidates (nodes with at most one child).

S(v) = L(v) + eff(v), unnormalized, where L(v) is the inflation level when v was last
touched and every victim raises the level to its own score. Entries age out as the level
passes them, efficient ones later; the order is scale-free, so there is no alpha to tune.
"""

from __future__ import annotations

import numpy as np

from marconi.core.candidates import Efficiency, Scored
from marconi.core.spec import ModelSpec


class GreedyDualFlop(Scored):
    """Marconi's candidates and FLOP efficiency (`Candidates`); a touch stamps the level.

    Lookups touch the node they resume from and commits the nodes they create, as in
    Marconi; the `rec` column holds the level at that touch.
    """

    compiled_as = "gd"  # the compiled core runs it (marconi.core.compiled)

    def __init__(self, spec: ModelSpec) -> None:
        self.efficiency = Efficiency(spec)
        super().__init__(self.efficiency)
        self.spec = spec
        self.level = 0.0  # inflation level: the score of the last victim (never falls)

    def fresh(self, alpha: float) -> GreedyDualFlop:
        """An empty GreedyDual-FLOP at level 0 (a shadow of Switchable's FLOP mode); its
        order has no weight, so `alpha` is not used."""
        return GreedyDualFlop(self.spec)

    def touched(self, now: int) -> float:
        """A touch stamps the level, not the clock."""
        return self.level

    def scores(self, now: int) -> np.ndarray:
        """S(v) = L(v) + eff(v) for every candidate, in row order."""
        n = len(self.columns)
        return self.columns["rec"][:n] + self.columns["eff"][:n]

    def chose(self, score: float) -> None:
        """Every victim raises the level to its own score."""
        self.level = max(self.level, score)

    def follow(self, now: int) -> None:
        """Raise the level to where this policy's own victim would put it, when another
        policy chose the victim (so that a switch to this one finds a live recency order;
        frozen at 0, it would rank by efficiency alone until the level caught up)."""
        if self.columns:
            self.level = max(self.level, float(self.scores(now).min()))
