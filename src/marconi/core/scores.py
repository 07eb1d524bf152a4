"""Marconi's eviction score over a candidate list, shared by every policy and integration
that orders candidates by it (docs/architecture.md, "Eviction").

`S(v) = recency(v) + alpha x eff(v)`, both min-max normalized over the current
candidates (all equal -> 1); the lowest score leaves first. Callers give the candidates
least recently used first, so a candidate's index is its recency rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from marconi.core.spec import ModelSpec


def normalized(x: np.ndarray) -> np.ndarray:
    """Min-max over the candidates; all equal -> 1 (as Marconi's terms)."""
    low, high = float(x.min()), float(x.max())
    return np.ones_like(x) if high == low else (x - low) / (high - low)


def flop_score(eff: np.ndarray, alpha: float) -> np.ndarray:
    """Each candidate's score; `eff[i]` is candidate i's FLOP efficiency, candidates
    least recently used first (the first lowest leaves first: `np.argmin`)."""
    rec = np.arange(len(eff), dtype=np.float64)
    return normalized(rec) + alpha * normalized(np.asarray(eff, dtype=np.float64))


def flop_order(eff: np.ndarray, alpha: float, last: np.ndarray | None = None) -> np.ndarray:
    """Indices of the candidates in the order to evict them.

    `eff[i]` is candidate i's FLOP efficiency, candidates least recently used first;
    `last` (optional, bool) marks candidates that go after every other (states at a
    branch, which Marconi never evicts). Ties keep recency order.
    """
    rec = np.arange(len(eff), dtype=np.float64)
    score = flop_score(eff, alpha)
    keys = (rec, score) if last is None else (rec, score, last)
    return np.lexsort(keys)


class FlopsAt:
    """`spec.flops(depth)`, memoized by depth: an eviction walk asks for the same depths
    again and again."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._memo: dict[int, float] = {}

    def __call__(self, depth: int) -> float:
        out = self._memo.get(depth)
        if out is None:
            out = self._memo[depth] = float(self.spec.flops(depth))
        return out
