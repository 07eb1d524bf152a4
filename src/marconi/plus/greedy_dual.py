"""GreedyDual-FLOP: GreedyDual-Size (Young's Landlord) with the FLOPs a node saves as its
cost, over Marconi's candidates (nodes with at most one child).

S(v) = L(v) + eff(v), unnormalized, where L(v) is the inflation level when v was last
touched and every victim raises the level to its own score. Entries age out as the level
passes them, efficient ones later; the order is scale-free, so there is no alpha to tune.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from marconi.core.candidates import Candidates, Efficiency
from marconi.core.policy import Eviction, Victim
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node


class GreedyDualFlop(Eviction):
    """Marconi's candidates and FLOP efficiency (`Candidates`); a touch stamps the level.

    Lookups touch the node they resume from and commits the nodes they create, as in
    Marconi; the `rec` column holds the level at that touch.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.level = 0.0  # inflation level: the score of the last victim (never falls)
        self.efficiency = Efficiency(spec)
        self.candidate_set = Candidates(self.stamp, self.efficiency)
        self.slots = self.candidate_set.slots

    def fresh(self, alpha: float) -> GreedyDualFlop:
        """An empty GreedyDual-FLOP at level 0 (a shadow of Switchable's FLOP mode); its
        order has no weight, so `alpha` is not used."""
        return GreedyDualFlop(self.spec)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        if hit is not None:
            self.stamp[hit] = self.level
            self.candidate_set.update(hit)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = self.level
            self.candidate_set.update(node)

    def changed(self, node: Node) -> None:
        self.candidate_set.update(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.candidate_set.discard(node)

    def scores(self, now: int) -> np.ndarray:
        """S(v) = L(v) + eff(v) for every candidate, in slot order."""
        n = len(self.slots)
        return self.slots["rec"][:n] + self.slots["eff"][:n]

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if not self.slots:
            return None
        score = self.scores(now)
        slot = self.candidate_set.lowest(score, protected)
        if slot is None:
            return None
        self.level = max(self.level, float(score[slot]))
        return self.candidate_set.victim(slot)

    def follow(self, now: int) -> None:
        """Raise the level to where this policy's own victim would put it, when another
        policy chose the victim (so that a switch to this one finds a live recency order;
        frozen at 0, it would rank by efficiency alone until the level caught up)."""
        if self.slots:
            self.level = max(self.level, float(self.scores(now).min()))

    def candidates(self) -> list[Node]:
        return self.candidate_set.nodes()

    def check(self, nodes: Sequence[Node]) -> None:
        self.candidate_set.check(nodes)
