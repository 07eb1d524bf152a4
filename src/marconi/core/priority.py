"""An eviction order declared as data: a `Priority` over a node's features, lowest first.

A policy that is only an order states it once, as a `Priority`: which nodes are
candidates, which nodes a lookup or commit touches, and the keys compared in turn (each
a weighted sum of features), the node's creation order breaking the last tie. The
evaluators read the declaration and nothing else: `Ranked` runs it on the Python core
(docs/architecture.md, "Declared priorities"). A policy module is then its declaration
plus its registration (`marconi.peers.lfu`).

```
Priority("lfu", keys=(Key(Term(HITS)), Key(Term(RECENCY))))
    -> Ranked: on every change a node's key (hits, last touch, id) -> a lazy heap
    -> victim: the smallest valid key outside the protected nodes
```

Features (`Feature`), each a node's own:

- `RECENCY`: the clock at its last touch (a lookup or commit that `touches` it);
- `HITS`: the commits whose sequence passed through it, its own creation included (an
  edge split keeps the count in both halves), SGLang's `hit_count`;
- `CREATED`: the clock when it entered the tree (a split's upper half keeps its child's);
- `DEPTH`: tokens from the root to the end of its edge;
- `STATE`: 1 when it holds an SSM state, else 0.

A `Term` may be a step (`at_least`: 1 when the feature reaches it, else 0), which is how
a segmented order (SLRU's probationary and protected segments) is written.

A policy whose order is relative to the candidates of the moment is declared as a `Score`
instead: each term's feature min-max normalized over the current candidates (all equal:
1), weighted, summed in order; the lowest leaves first. A `tuned` term's weight is
multiplied by the policy's alpha (the knob its tuner turns). Marconi's order is one
(`marconi.paper.eviction.MARCONI`):

```
Score("marconi", terms=(Term(RECENCY), Term(EFFICIENCY, tuned=True)))
    -> S(v) = minmax(last touch) + alpha x minmax(FLOPs saved per byte), lowest first
```

A score reads, besides `RECENCY` (where an engine keeps a list and no clock, a
candidate's rank in it, least recently used first, as the plugins and the engines'
emulations read it), features relative to the node's neighbours:

- `INVERSE_AGE`: `1 / (now - last touch + 1)` (the artifact's recency);
- `EFFICIENCY`: prefill FLOPs it saves over where its replay starts, per byte it holds;
- `REPLAY`: tokens from the nearest ancestor holding a state to it (what a hit recomputes
  if it left);
- `LEVEL`: the inflation level when it was last touched, where the level is the highest
  score a victim has had so far (an evaluator stamps it at each touch and raises it at each
  victim). It reads in an unnormalized score only (`normalized=False`: each term's feature
  as it is, weighted, summed), and in place of `RECENCY` (a touch stamps one or the other).
  GreedyDual-FLOP is one (`marconi.plus.greedy_dual.GREEDY_DUAL_FLOP`):

```
Score("greedy-dual-flop", terms=(Term(LEVEL), Term(EFFICIENCY)), normalized=False)
    -> S(v) = L(v) + FLOPs saved per byte; a victim raises the level to its S
```

- `DENSITY`: learned by its evaluator from the hits and evictions it sees: how often
  candidates of the node's class (leaf or interior; leaves by depth where the evaluator
  classes them so), as idle as it is now, were still hit, per tick they then stayed
  (`marconi.plus.density.HitDensity` learns it; it reads the clock, not the level).

A `product` score multiplies its weighted terms in order instead of summing them
(unnormalized only). FLOP-weighted hit density is one (`marconi.plus.density.HIT_DENSITY`):

```
Score("hit-density", terms=(Term(EFFICIENCY), Term(DENSITY)), normalized=False,
      product=True)
    -> S(v) = FLOPs saved per byte x learned density(class, idle age), lowest first
```

An admission that only places states is declared as a `Placement`: at the branch point
(where a sequence leaves the tree at a new or stateless branch), every `every` tokens (the
final partial block of a sequence growing in place as a later one extends it), at the end
of the sequence, or any union of these; none of them: nothing is cached. The evaluators:
`marconi.core.placement.Placed` on the Python core, `Core::set_placement` on the compiled
one. Marconi's judicious admission is one (`marconi.paper.admission.JUDICIOUS`):

```
Placement("judicious", branch=True, end=True)
    -> checkpoints: the branch point of the input past the hit
    -> positions: the branch point of input + output, and its end
```
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Feature(Enum):
    RECENCY = "recency"
    HITS = "hits"
    CREATED = "created"
    DEPTH = "depth"
    STATE = "state"
    # a `Score`'s only (relative to the node's neighbours or the clock of the choice)
    INVERSE_AGE = "inverse-age"
    EFFICIENCY = "efficiency"
    REPLAY = "replay"
    LEVEL = "level"
    DENSITY = "density"  # learned by its evaluator (`marconi.plus.density.HitDensity`)


# what a `Priority`'s keys may read: a node's own features
NODE_FEATURES = frozenset({Feature.RECENCY, Feature.HITS, Feature.CREATED, Feature.DEPTH,
                           Feature.STATE})


class Candidates(Enum):
    LEAVES = "leaves"  # unpinned nodes without children: evicting one removes it
    # unpinned nodes with at most one child: a leaf is removed, a one-child node merged
    ONE_CHILD = "one-child"


class Touches(Enum):
    PATH = "path"  # a lookup stamps every node it matched, a commit every node it passed
    HIT = "hit"  # a lookup stamps the node it resumes from, a commit the nodes it creates


@dataclass(frozen=True)
class Term:
    """`weight x feature`, or with `at_least`, `weight x (feature >= at_least)`; `tuned`
    (a `Score`'s only): the weight times the policy's alpha."""

    feature: Feature
    weight: float = 1.0
    at_least: float | None = None
    tuned: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.weight):
            raise ValueError(f"term {self.feature.value}: weight must be finite, got "
                             f"{self.weight}")
        if self.at_least is not None and not math.isfinite(self.at_least):
            raise ValueError(f"term {self.feature.value}: at_least must be finite, got "
                             f"{self.at_least}")


@dataclass(frozen=True)
class Key:
    """One key of the lexicographic order: the sum of its terms."""

    terms: tuple[Term, ...]

    def __init__(self, *terms: Term) -> None:
        if not terms:
            raise ValueError("a key needs at least one term")
        object.__setattr__(self, "terms", terms)


@dataclass(frozen=True)
class Priority:
    """An eviction order: among `candidates`, the node whose `keys` compare lowest leaves
    first (then the lowest creation id, which every evaluator breaks ties with)."""

    name: str
    keys: tuple[Key, ...]
    candidates: Candidates = Candidates.LEAVES
    touches: Touches = Touches.PATH
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError(f"priority {self.name!r}: needs at least one key")
        for key in self.keys:
            for term in key.terms:
                if term.feature not in NODE_FEATURES:
                    raise ValueError(f"priority {self.name!r}: a key reads a node's own "
                                     f"features, not {term.feature.value!r} (a Score's)")
                if term.tuned:
                    raise ValueError(f"priority {self.name!r}: term {term.feature.value} "
                                     "is tuned, and a Priority has no alpha (a Score has)")

    @property
    def features(self) -> frozenset[Feature]:
        """The features its keys read (an evaluator keeps books for these only)."""
        return frozenset(t.feature for k in self.keys for t in k.terms)


@dataclass(frozen=True)
class Score:
    """An eviction order relative to the candidates of the moment: each term's feature
    min-max normalized over them (all equal: 1; `normalized=False`: as it is), times its
    weight (a `tuned` one's times alpha), summed in order (`product`: multiplied, an
    unnormalized score's only); the lowest leaves first."""

    name: str
    terms: tuple[Term, ...]
    candidates: Candidates = Candidates.ONE_CHILD
    touches: Touches = Touches.HIT
    normalized: bool = True
    product: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError(f"score {self.name!r}: needs at least one term")
        if self.product and self.normalized:
            raise ValueError(f"score {self.name!r}: a product of terms is unnormalized "
                             "only (normalized=False): each normalized term's lowest is 0")
        if Feature.DENSITY in self.features and Feature.LEVEL in self.features:
            raise ValueError(f"score {self.name!r}: reads density and level: density is "
                             "learned at each candidate's idle age on the clock, and a "
                             "touch stamps the level or the clock, not both")
        for term in self.terms:
            if term.at_least is not None:
                raise ValueError(f"score {self.name!r}: term {term.feature.value} is a "
                                 "step, and a Score's terms are normalized (a Priority "
                                 "may step)")
            if term.weight < 0:
                raise ValueError(f"score {self.name!r}: term {term.feature.value} weighs "
                                 f"{term.weight}: weights are >= 0")
        if Feature.LEVEL in self.features:
            if self.normalized:
                raise ValueError(f"score {self.name!r}: reads level, which an unnormalized "
                                 "score only may read (normalized=False): the level rises "
                                 "to each victim's score")
            clock = self.features & {Feature.RECENCY, Feature.INVERSE_AGE}
            if clock:
                raise ValueError(f"score {self.name!r}: reads level and "
                                 f"{', '.join(sorted(f.value for f in clock))}: a touch "
                                 "stamps the level or the clock, not both")

    @property
    def features(self) -> frozenset[Feature]:
        """The features its terms read (an evaluator computes these only)."""
        return frozenset(t.feature for t in self.terms)

    @property
    def leveled(self) -> bool:
        """Whether it reads `LEVEL`: its evaluator stamps the level at each touch and
        raises it to each victim's score."""
        return Feature.LEVEL in self.features

    @property
    def tuned(self) -> bool:
        """Whether alpha weighs one of its terms (a tuner has something to turn)."""
        return any(t.tuned for t in self.terms)

    def weights(self, alpha: float) -> list[float]:
        """Each term's weight at `alpha`."""
        return [t.weight * alpha if t.tuned else t.weight for t in self.terms]

    def by_recency(self, alpha: float) -> bool:
        """Whether at `alpha` it orders by recency alone (every other term weighs 0,
        recency more): an evaluator given candidates least recently used first may then
        take them in that order (Marconi's at alpha 0: an engine's own LRU order)."""
        if self.product:
            return False
        pairs = list(zip(self.weights(alpha), self.terms, strict=True))
        return all(w == 0 for w, t in pairs if t.feature is not Feature.RECENCY) \
            and any(w > 0 for w, t in pairs if t.feature is Feature.RECENCY)


def terms(priority: Priority) -> tuple[list[int], list[int], list[float], list[float]]:
    """The declaration as the compiled core reads it (`Core::set_keys`): per term its key's
    index, its feature's index in `Feature`, its weight and its step (NaN: none)."""
    order = list(Feature)
    rows = [(k, order.index(t.feature), t.weight,
             math.nan if t.at_least is None else t.at_least)
            for k, key in enumerate(priority.keys) for t in key.terms]
    return ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
            [r[3] for r in rows])


def key_function(keys: Sequence[Key], read: Mapping[Feature, Callable[..., float]], *,
                 one_as_float: bool = False) -> Callable[..., Any]:
    """`keys` as one function of the arguments `read`'s functions take (a node; a block and
    its rank), reading only the features the keys name, each key summed in `key_value`'s
    order: a tuple of the keys' values (with `one_as_float`, one key's value as a float;
    no keys: 0.0). What an evaluator calls for every candidate, without the dict of every
    feature that `key_value` reads."""

    def summed(key: Key) -> Callable[..., float]:
        terms = [(read[t.feature], t.weight, t.at_least) for t in key.terms]

        def value(*node: Any) -> float:
            total = 0.0
            for feature, weight, step in terms:
                x = feature(*node)
                if step is not None:
                    x = 1.0 if x >= step else 0.0
                total += weight * x
            return total
        return value

    parts = [summed(k) for k in keys]
    if not parts:
        return lambda *node: 0.0
    if len(parts) == 1:
        only = parts[0]
        return only if one_as_float else lambda *node: (only(*node),)
    return lambda *node: tuple(part(*node) for part in parts)


def key_value(key: Key, values: dict[Feature, float]) -> float:
    """`key` over one node's feature `values`."""
    total = 0.0
    for term in key.terms:
        x = values[term.feature]
        if term.at_least is not None:
            x = 1.0 if x >= term.at_least else 0.0
        total += term.weight * x
    return total


@dataclass(frozen=True)
class Placement:
    """Where an admission places states: at the branch point (`branch`), every `every`
    tokens (0: not), at the end of the sequence (`end`); any union. Prefill captures the
    input's branch point and blocks past the hit; the rest, the end included, is taken at
    commit. None of them: the cache keeps nothing."""

    name: str
    branch: bool = False
    every: int = 0
    end: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"placement {self.name!r}: every must be an integer >= 0 "
                             f"(tokens; 0: no blocks), got {self.every!r}")

    @property
    def caches(self) -> bool:
        """Whether it places any state (a cache placing none keeps nothing)."""
        return self.branch or self.every > 0 or self.end


class ListVictim(Enum):
    """Which of an engine's two lists gives the next victim (`Lists`)."""

    # the older of the two heads, a state on a tie (one free queue over both: vLLM's)
    OLDER_HEAD = "older-head"
    # the state list while states are over their budget (the state pool's, or their share
    # of one budget, counting the pending insert's), else the KV list; either falls back
    # to the other (a pool each: SGLang's)
    SHORT_POOL = "short-pool"


@dataclass(frozen=True)
class TailSafe:
    """A KV list that gives its first TEL-safe leaf first, then its head (T-LRU, as SGLang
    runs it): a leaf whose edge starts at or past `high + next_prompt - threshold` (and
    0), `high` the deepest depth ever committed at or below it, may leave without
    lengthening its conversation's next prefill past `threshold` tokens, the next prompt
    adding about `next_prompt`."""

    threshold: int
    next_prompt: int

    def __post_init__(self) -> None:
        if self.threshold < 0 or self.next_prompt < 0:
            raise ValueError("T-LRU needs threshold >= 0 and next_prompt_estimate >= 0, "
                             f"got {self.threshold} and {self.next_prompt}")

    def safe(self, start: int, high: int) -> bool:
        """Whether a leaf whose edge starts at depth `start`, under a high-water depth
        `high`, may leave (SGLang's `TLRUStrategy`)."""
        return start >= max(high + self.next_prompt - self.threshold, 0)


@dataclass(frozen=True)
class Lists:
    """An engine's eviction as two LRU lists over one tree, declared: one of KV leaves
    (a leaf leaving whole, its state with it), one of states (any node's, a state leaving
    alone). A lookup touches the KV up to the hit and the hit's state; a commit the KV of
    its whole path, a state gained stamped then. `victim`: which list gives the victim;
    `shallow_first`: at equal stamps the entry nearer the root leaves first (else the
    deeper: a request's blocks freed tail first); `garbage`: a leaf left without a state
    is garbage, collected at once, and a state at a leaf leaves with its leaf;
    `tail_safe`: the KV list's TEL-safe leaves first (`TailSafe`; by pool only).
    `peers.two_lists.TwoListLRU` evaluates it on the Python core, `Core::set_lists` on the
    compiled one."""

    name: str
    victim: ListVictim
    shallow_first: bool
    garbage: bool
    tail_safe: TailSafe | None = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.tail_safe is not None and self.victim is not ListVictim.SHORT_POOL:
            raise ValueError(f"lists {self.name!r}: a TEL-safe KV order (tail_safe) needs "
                             "the victim by pool (ListVictim.SHORT_POOL)")
