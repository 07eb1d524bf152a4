"""Hit-density eviction: evict what saves the fewest FLOPs per byte per unit of time.

Marconi scores an entry by recency plus alpha x FLOP efficiency and needs a tuner to
weigh the two; GreedyDual-FLOP adds them without a weight but still mixes units.
`HitDensity` (after Beckmann et al.'s LHD, with FLOPs as the value of a hit) learns
instead how likely an entry of a given idle age is to be hit again, and how long it will
sit in the cache until then:

    score(v) = eff(v) x density(class(v), age(v))
    density(c, a) = P(hit | class c survived to age a) / E[remaining time in cache]

declared once as `HIT_DENSITY` (a product of two terms: `core.priority`, `Feature.DENSITY`
the table below), which both cores evaluate. `eff` is Marconi's FLOPs saved per byte held;
`age` is clock ticks since v was last touched; the classes are leaves and interior nodes
(a single-child node whose request moved on: in chat and agent traces its state is rarely
reused, a leaf's often). Every
hit and every eviction is counted at the age it happened, in log-spaced age buckets
(`per_octave` a doubling), and the tables decay so the estimate follows the workload:

```
hits   h[c, b]  ·  ·  #  #  ·  ·  ·     density(c, a) = sum_{b >= a} h[c, b]
events n[c, b]  ·  #  #  #  #  ·  #                    / sum_{b >= a} n[c, b] (t_b - t_a + 1)
                0  1  2  3  4  5  6  <- age bucket (log2 of ticks since last touch)
```
No knob needs tuning per workload. Before the first `every` events the table is a prior,
density ~ 1 / (age + 1): FLOP efficiency over idle time, a recency-weighted start.

What the learned table really ranks by. Every age bucket, up to the oldest (2^24 ticks),
holds pseudo-counts of `PRIOR_HITS` hits and `PRIOR_EVENTS` events. Spread over the whole
age range they add a prior exposure (`prior_exposure`) to the remaining time of every
young age that is several times what the decayed real counts hold, so the denominator is
nearly a constant and

    score(v) ~ eff(v) x (decayed hits seen at idle ages >= age(v))

FLOP efficiency times how often entries this idle were still hit; ages past every
observed hit score near zero (stale entries leave first). It is a heavily shrunk LHD,
kept because it measured better than LHD's own estimate, which evicts the freshest
entries first (an MRU-like order that loses when sessions return at random). The
measurements: experiments/RESULTS.md ("Beyond Marconi": "What marconi+ is" and "How
the pieces were chosen").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from marconi.core.books import CoreBooks
from marconi.core.candidates import Declared
from marconi.core.compiled import first_ages
from marconi.core.priority import Feature, Score, Term
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node

LEAF, INTERIOR = 0, 1
DEPTH_BASE = 1024  # with depth classes: leaves under 2 x DEPTH_BASE tokens share the first
PRIOR_HITS, PRIOR_EVENTS = 1e-3, 2e-3  # pseudo-counts in every age bucket (module doc)
# the compiled core's bucket and class bounds per shape (`HitDensity.compiled_books`)
_FIRSTS: dict[tuple[int, ...], tuple[list[float], list[float], list[int]]] = {}


# FLOP-weighted hit density, declared once: the compiled core and `HitDensity` evaluate it
HIT_DENSITY = Score("hit-density", terms=(Term(Feature.EFFICIENCY), Term(Feature.DENSITY)),
                    normalized=False, product=True,
                    description="FLOPs saved per byte x the learned hit density of the "
                                "candidate's class at its idle age, lowest first")


class HitDensity(Declared):
    """`HIT_DENSITY` over Marconi's candidates (nodes with at most one child), with the
    density it reads learned here (module doc).

    The candidates' columns (`Candidates`: `rec` the clock at the last touch, `eff` the
    FLOP efficiency) carry each candidate's class too (`cls`). It has no alpha: the table
    weighs efficiency against age.

    With `depth_classes` > 0 leaves are classed by depth too, `per_doubling` classes per
    doubling from `depth_base` tokens (classes 2, 3, ...; the first takes everything
    shallower, the last everything deeper):
    how long a session has gone on predicts whether it goes on (a long chat usually
    continues; an agent near its step budget stops), and each class learns its own table.
    As the prior swamps the time term (module doc), classes compare by the hits each
    produced at ages >= a, not by per-entry rates.
    """

    FEATURES = Declared.FEATURES | {Feature.DENSITY}
    compiled_as = "scored"  # the compiled core evaluates its score, the density learned there

    def core_books(self) -> CoreBooks:
        """Its declared score and the books the compiled core learns the density from
        (`compiled_books`)."""
        return CoreBooks(score=self.score, level=self.level,
                         densities=(self.compiled_books(),))

    def __init__(self, spec: ModelSpec, *, per_octave: int = 8, buckets: int = 192,
                 every: int = 512, decay: float = 0.9, depth_classes: int = 0,
                 depth_base: int = DEPTH_BASE, per_doubling: int = 1) -> None:
        if per_octave < 1 or buckets < 2 or every < 1 or not 0 < decay <= 1 \
                or depth_classes < 0 or depth_base < 1 or per_doubling < 1:
            raise ValueError("HitDensity needs per_octave >= 1, buckets >= 2, every >= 1, "
                             "0 < decay <= 1, depth_classes >= 0, depth_base >= 1 and "
                             f"per_doubling >= 1; got {per_octave}, {buckets}, {every}, "
                             f"{decay}, {depth_classes}, {depth_base}, {per_doubling}")
        super().__init__(HIT_DENSITY, spec, extra={"cls": np.intp})
        self.spec = spec
        self.per_octave, self.every, self.decay = per_octave, every, decay
        self.depth_classes, self.depth_base = depth_classes, depth_base
        self.per_doubling = per_doubling
        self.start = 2.0 ** (np.arange(buckets) / per_octave) - 1  # first age of each bucket
        classes = 2 + depth_classes
        self.hits = np.zeros((classes, buckets))  # decayed counts of hits at each age
        self.events = np.zeros((classes, buckets))  # hits and evictions at each age
        self.density = np.tile(1.0 / (self.start + 1.0), (classes, 1))  # the prior
        self.counted = 0
        self.now = 0

    def bucket(self, age: np.ndarray | float) -> np.ndarray:
        """The age bucket of each age (ticks since the last touch)."""
        ages = np.maximum(np.asarray(age, dtype=np.float64), 0.0)
        index = (np.log2(ages + 1.0) * self.per_octave).astype(np.intp)
        return np.minimum(index, len(self.start) - 1)

    def _bucket_of(self, age: float) -> int:
        """`bucket` of one age, without building arrays (the same ufunc, the same bucket)."""
        index = int(np.log2(max(float(age), 0.0) + 1.0) * self.per_octave)
        return min(index, len(self.start) - 1)

    def _count(self, node: Node, hit: bool) -> None:
        """Record that candidate `node` was hit (or left the cache) at its idle age."""
        b = self._bucket_of(self.now - self.stamp.get(node, self.now))
        c = int(self.columns["cls"][self.columns.index[node]])
        self.events[c, b] += 1
        if hit:
            self.hits[c, b] += 1
        self.counted += 1
        if self.counted % self.every == 0:
            self.learn()

    def learn(self) -> None:
        """Recompute the density tables from the counts, then age the counts."""
        hits, events = self.hits + PRIOR_HITS, self.events + PRIOR_EVENTS
        above = np.cumsum(hits[:, ::-1], axis=1)[:, ::-1]  # hits at this age or later
        n_above = np.cumsum(events[:, ::-1], axis=1)[:, ::-1]
        nt_above = np.cumsum((events * self.start)[:, ::-1], axis=1)[:, ::-1]
        remaining = nt_above - n_above * self.start + n_above  # sum n_b (t_b - t_a + 1)
        self.density = above / remaining
        self.hits *= self.decay
        self.events *= self.decay

    def compiled_books(self) -> tuple[Any, ...]:
        """What the compiled core's hit density starts from (`NativeCore.set_density`):
        the first age of each bucket as `bucket` (the array path, scores) and `_bucket_of`
        (one age, counts) put it, the first depth of each depth class past the first as
        `classify` puts it (the core bisects these: no logarithm of its own), the tables
        and the constants."""
        shape = (self.per_octave, len(self.start), self.depth_classes, self.depth_base,
                 self.per_doubling)
        firsts = _FIRSTS.get(shape)
        if firsts is None:  # the same for every policy of this shape: found once
            buckets = len(self.start)
            vec = first_ages(lambda a: int(self.bucket(np.array([float(a)]))[0]), buckets)
            one = first_ages(self._bucket_of, buckets)
            depth_from: list[int] = []
            if self.depth_classes:
                def cls(depth: int) -> int:
                    leaf = SimpleNamespace(children={}, depth=max(depth, 1))
                    return self.classify(leaf) - 2  # type: ignore[arg-type]
                depth_from = [int(a) for a in first_ages(cls, self.depth_classes)[1:]]
            firsts = _FIRSTS[shape] = (vec, one, depth_from)
        vec, one, depth_from = firsts
        return ([float(x) for x in self.start], vec, one, depth_from,
                self.hits.ravel().tolist(), self.events.ravel().tolist(),
                self.density.ravel().tolist(), int(self.counted), int(self.every),
                float(self.decay), PRIOR_HITS, PRIOR_EVENTS, int(self.depth_classes))

    def prior_exposure(self, age: float = 0.0) -> float:
        """Ticks the pseudo-counts add to the remaining time of an entry of idle `age`."""
        b = int(self.bucket(age))
        return float(PRIOR_EVENTS * np.sum(self.start[b:] - self.start[b] + 1))

    # --- events --------------------------------------------------------------------

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self.now = now
        if hit is not None and hit in self.columns:
            self._count(hit, hit=True)
        super().on_lookup(path, hit, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        self.now = now
        super().on_commit(path, new, now)

    def classify(self, node: Node) -> int:
        """The class a candidate's hits and evictions are counted in."""
        if node.children:
            return INTERIOR
        if not self.depth_classes:
            return LEAF
        steps = int(np.log2(max(node.depth, 1) / self.depth_base) * self.per_doubling)
        return 2 + min(max(steps, 0), self.depth_classes - 1)

    def changed(self, node: Node) -> None:
        row = self.candidate_set.update(node)
        if row is not None:
            self.columns["cls"][row] = self.classify(node)

    def removed(self, node: Node) -> None:
        if node in self.columns:
            self._count(node, hit=False)
        super().removed(node)

    def values(self, now: int) -> dict[Feature, np.ndarray]:
        """`Declared.values`, and `DENSITY`: the table at each candidate's class and the
        bucket of its idle age."""
        out = super().values(now)
        if Feature.DENSITY in self._features:
            n, columns = len(self.columns), self.columns
            ages = self.bucket(now - columns["rec"][:n])
            out[Feature.DENSITY] = self.density[columns["cls"][:n], ages]
        return out

    def scores(self, now: int) -> np.ndarray:
        self.now = now
        return super().scores(now)

    def check(self, nodes: Sequence[Node]) -> None:
        super().check(nodes)
        for node in self.candidates():
            row = self.columns.index[node]
            assert self.columns["cls"][row] == self.classify(node), f"stale class for {node!r}"
