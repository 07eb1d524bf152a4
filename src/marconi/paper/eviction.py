"""The paper's evictions: LRU over leaves (SGLang+, vLLM+) and FLOP-aware (Marconi).

See docs/architecture.md ("Eviction") for the rules they follow.
"""

from __future__ import annotations

from enum import Enum

from marconi.core.candidates import Declared
from marconi.core.policy import check_alpha
from marconi.core.priority import Feature, Key, Priority, Score, Term
from marconi.core.ranked import Ranked
from marconi.core.spec import ModelSpec

# LRU over leaves, declared once (every core, emulation and plugin evaluates it): the
# least recently touched leaf first; vLLM+'s breaks ties deepest first, so blocks touched
# together leave tail first
LRU = Priority("lru", keys=(Key(Term(Feature.RECENCY)),),
               description="leaves, least recently used first")
LRU_DEEPEST_FIRST = Priority("lru-deepest-first",
                             keys=(Key(Term(Feature.RECENCY)),
                                   Key(Term(Feature.DEPTH, weight=-1.0))),
                             description="leaves, least recently used first, ties deepest "
                                         "first")


class LRULeaf(Ranked):
    """Leaves only, least recently used first (SGLang+ of the paper; vLLM+ with
    `deepest_first`, where blocks touched together leave tail first): `LRU` or
    `LRU_DEEPEST_FIRST`, evaluated as any declared priority is (`core.ranked.Ranked`).

    A lookup or commit touches every node on the path.
    """

    compiled_as = "ranked"  # the compiled core evaluates its declaration

    def __init__(self, *, deepest_first: bool = False) -> None:
        super().__init__(LRU_DEEPEST_FIRST if deepest_first else LRU)
        self.deepest_first = deepest_first


class Recency(Enum):
    TIME = "time"  # last access time (the paper)
    INVERSE_AGE = "inverse-age"  # 1 / (now - t + 1) (the artifact's variant)


# Marconi's order, declared once: every core, emulation and plugin evaluates it
MARCONI = Score("marconi", terms=(Term(Feature.RECENCY), Term(Feature.EFFICIENCY, tuned=True)),
                description="last touch + alpha x FLOPs saved per byte, each min-max "
                            "normalized over the candidates, lowest first")
# the artifact's variant: recency as 1 / (now - last touch + 1)
MARCONI_INVERSE_AGE = Score("marconi-inverse-age",
                            terms=(Term(Feature.INVERSE_AGE),
                                   Term(Feature.EFFICIENCY, tuned=True)),
                            description="Marconi's score, recency as the inverse age")
SCORES = {Recency.TIME: MARCONI, Recency.INVERSE_AGE: MARCONI_INVERSE_AGE}


class FlopAware(Declared):
    """Marconi: score S(v) = recency(v) + alpha * eff(v), lowest evicted first (`MARCONI`,
    or `MARCONI_INVERSE_AGE` with the artifact's recency).

    Candidates (`Candidates`) are unpinned nodes with at most one child. Both terms are
    min-max normalized over the current candidates (all equal -> 1) and recomputed for
    every victim. `eff(v) = (F(len(v)) - F(len(parent))) / bytes(v)`. Only the node a
    lookup hits is touched; a commit stamps the nodes it creates.

    Candidates live in dense numpy columns (`rec` the last touch, `eff` the efficiency),
    so a victim among 10^4 candidates is a handful of vector operations.
    """

    compiled_as = "scored"  # the compiled core evaluates its score (marconi.core.compiled)

    def __init__(self, spec: ModelSpec, alpha: float = 0.0,
                 recency: Recency = Recency.TIME) -> None:
        self.recency = Recency(recency)
        super().__init__(SCORES[self.recency], spec, alpha)
        self.spec = spec
        self.alpha: float = check_alpha(alpha)

    def set_alpha(self, alpha: float) -> None:
        self.alpha = check_alpha(alpha)

    def fresh(self, alpha: float) -> FlopAware:
        """An empty policy like this one (same spec and recency) running `alpha`."""
        return FlopAware(self.spec, alpha, self.recency)
