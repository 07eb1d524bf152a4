"""GreedyDual-FLOP: GreedyDual-Size (Young's Landlord) with the FLOPs a node saves as its
cost, over Marconi's candidates (nodes with at most one child), declared once as a score
(`GREEDY_DUAL_FLOP`) that every core evaluates (docs/architecture.md, "Declared
priorities").

S(v) = L(v) + eff(v), unnormalized, where L(v) is the inflation level when v was last
touched and every victim raises the level to its own score. Entries age out as the level
passes them, efficient ones later; the order is scale-free, so there is no alpha to tune.
"""

from __future__ import annotations

from marconi.core.candidates import Declared
from marconi.core.priority import Feature, Score, Term
from marconi.core.spec import ModelSpec

GREEDY_DUAL_FLOP = Score("greedy-dual-flop",
                         terms=(Term(Feature.LEVEL), Term(Feature.EFFICIENCY)),
                         normalized=False,
                         description="the level at the last touch + FLOPs saved per byte, "
                                     "lowest first; each victim raises the level to its "
                                     "score")


class GreedyDualFlop(Declared):
    """`GREEDY_DUAL_FLOP` over Marconi's candidates (`Declared`): a touch stamps the level,
    each victim raises it, and under `Switchable` another expert's victim too (`follow`).

    Lookups touch the node they resume from and commits the nodes they create, as in
    Marconi; the `rec` column holds the level at that touch.
    """

    compiled_as = "scored"  # the compiled core evaluates its score (marconi.core.compiled)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(GREEDY_DUAL_FLOP, spec)
        self.spec = spec

    def fresh(self, alpha: float) -> GreedyDualFlop:
        """An empty GreedyDual-FLOP at level 0 (a shadow of Switchable's FLOP mode); its
        order has no weight, so `alpha` is not used."""
        return GreedyDualFlop(self.spec)
