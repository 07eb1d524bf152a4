"""A declared `Score` (marconi.core.priority) evaluated over a list of candidates: by
every policy and integration that orders candidates by one (docs/architecture.md,
"Declared priorities"), so that a score is written once, in its policy's module.

`evaluate`: each term's feature min-max normalized over the candidates (all equal -> 1;
an unnormalized score's as it is), times its weight (a tuned term's times alpha), summed in
the declaration's order (a `product` score's multiplied); the lowest score leaves first.
`in_python` is the same, bit for bit, on lists (fewer than some fifty candidates cost less
there than numpy's calls).
Callers that keep candidates in a list and no clock give them least recently used first,
and their rank as `RECENCY` (`ranks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from marconi.core.priority import Feature, Score

if TYPE_CHECKING:
    from marconi.core.spec import ModelSpec


# what an evaluator over an engine's own list computes: a candidate's rank in it, least
# recently used first (`RECENCY`), and the FLOPs it saves per byte (`EFFICIENCY`); the
# engines' emulations, both plugins and vLLM's offload policy evaluate these
OVER_A_LIST = frozenset({Feature.RECENCY, Feature.EFFICIENCY})


def normalized(x: np.ndarray) -> np.ndarray:
    """Min-max over the candidates; all equal -> 1."""
    low, high = float(x.min()), float(x.max())
    return np.ones_like(x) if high == low else (x - low) / (high - low)


def ranks(n: int) -> np.ndarray:
    """`RECENCY` for `n` candidates given least recently used first: their ranks."""
    return np.arange(n, dtype=np.float64)


def check_features(score: Score, have: frozenset[Feature] | set[Feature], who: str) -> None:
    """ValueError naming `who` and the feature, unless `score` reads only features in
    `have` (what that evaluator computes)."""
    missing = score.features - set(have)
    if missing:
        names = ", ".join(sorted(f.value for f in missing))
        raise ValueError(f"{who} cannot evaluate score {score.name!r}: it reads {names}, "
                         f"and {who} computes only "
                         f"{', '.join(sorted(f.value for f in have))}")


def evaluate(score: Score, values: Mapping[Feature, np.ndarray], alpha: float) -> np.ndarray:
    """Each candidate's score (a fresh array), `values[f][i]` candidate i's feature f."""
    total: np.ndarray | None = None
    for weight, term in zip(score.weights(alpha), score.terms, strict=True):
        x = np.asarray(values[term.feature], dtype=np.float64)
        part = normalized(x) if score.normalized else x
        if weight != 1.0:
            part = weight * part
        total = part if total is None else total * part if score.product else total + part
    assert total is not None  # (a Score has a term)
    # (one unnormalized term of weight 1 is its column itself: a fresh copy of it)
    return total.copy() if len(score.terms) == 1 and total is x else total


def in_python(score: Score, values: Mapping[Feature, Sequence[float]],
              alpha: float) -> list[float]:
    """`evaluate(...).tolist()`, bit for bit, in plain Python: the same IEEE operations on
    the same doubles in the same order (a weight of 1 multiplies exactly, so every term is
    weighed here)."""
    if not score.normalized:
        raw: list[float] | None = None
        for weight, term in zip(score.weights(alpha), score.terms, strict=True):
            part = [weight * x for x in values[term.feature]]
            raw = part if raw is None else \
                [a * b for a, b in zip(raw, part, strict=True)] if score.product else \
                [a + b for a, b in zip(raw, part, strict=True)]
        assert raw is not None
        return raw
    terms = []  # per term: its column, its low, its span (0: all equal), its weight
    for weight, term in zip(score.weights(alpha), score.terms, strict=True):
        xs = values[term.feature]
        low, high = min(xs), max(xs)
        terms.append((xs, low, high - low if high != low else 0.0, weight))
    if len(terms) == 2:  # (the common form, one pass)
        (a, la, sa, wa), (b, lb, sb, wb) = terms
        if sa and sb:
            return [wa * ((x - la) / sa) + wb * ((y - lb) / sb) for x, y in zip(a, b, strict=True)]
        if sb:
            return [wa * 1.0 + wb * ((y - lb) / sb) for y in b]
        if sa:
            return [wa * ((x - la) / sa) + wb * 1.0 for x in a]
        return [wa * 1.0 + wb * 1.0] * len(a)
    total: list[float] | None = None
    for xs, low, span, weight in terms:
        part = [weight * ((x - low) / span) for x in xs] if span else [weight * 1.0] * len(xs)
        total = part if total is None else [a + b for a, b in zip(total, part, strict=True)]
    assert total is not None
    return total


def first_lowest(score: Score, values: Mapping[Feature, Sequence[float]], alpha: float
                 ) -> int:
    """`int(np.argmin(evaluate(...)))` in plain Python: the first lowest score's index."""
    scores = in_python(score, values, alpha)
    return scores.index(min(scores))


def order(score: Score, values: Mapping[Feature, np.ndarray], alpha: float,
          last: np.ndarray | None = None) -> np.ndarray:
    """Indices of the candidates (given least recently used first) in the order to evict
    them: lowest score first, ties in the given order; `last` (optional, bool) marks
    candidates that go after every other (states at a branch, where an engine walks them
    and Marconi's candidates leave them out)."""
    score_of = evaluate(score, values, alpha)
    given = ranks(len(score_of))
    keys = (given, score_of) if last is None else (given, score_of, last)
    return np.lexsort(keys)


@dataclass(frozen=True)
class ListScore:
    """A declared score over an engine's own state list, as an engine's emulation or
    plugin puts it there: `score` over `OVER_A_LIST`, each state's `EFFICIENCY` from
    `spec` (the policy's own model) over its parent (`from_parent`: an engine that keeps
    a tree) or over the nearest state above it; `branches_last`: states at a node with two
    or more children go after every other. Both cores evaluate it
    (`peers.two_lists.FlopStates`, `Core::set_state_score`)."""

    score: Score
    spec: ModelSpec
    from_parent: bool
    branches_last: bool


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
