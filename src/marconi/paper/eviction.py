"""The paper's evictions: LRU over leaves (SGLang+, vLLM+) and FLOP-aware (Marconi).

See docs/architecture.md ("Eviction") for the rules they follow.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence
from enum import Enum

from marconi.core.candidates import Declared
from marconi.core.compiled_forms import CoreBooks
from marconi.core.lazy_heap import HeapEntry, compact, lazy_min
from marconi.core.policy import Action, Eviction, Victim, check_alpha
from marconi.core.priority import Feature, Score, Term
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node

REMOVE = Action.REMOVE  # read per victim (an enum member through its class is slower)


class LRULeaf(Eviction):
    """Leaves only, least recently used first (SGLang+ of the paper; vLLM+ with
    `deepest_first`, where blocks touched together leave tail first).

    A lookup or commit touches every node on the path. Lazy heap: stale entries are
    skipped when popped.
    """

    compiled_as = "lru"  # the compiled core runs it, either tie-break (marconi.core.compiled)

    def core_books(self) -> CoreBooks:
        return CoreBooks(deepest_first=self.deepest_first)

    def __init__(self, *, deepest_first: bool = False) -> None:
        super().__init__()
        self.deepest_first = deepest_first
        self._heap: list[HeapEntry] = []

    def changed(self, node: Node) -> None:
        """A node that is a live leaf gets a fresh entry at its stamp (entries that went
        stale stay in the heap and are dropped when they surface)."""
        if not node.children and not node.pins and node.parent is not None:  # a live leaf
            depth = -node.depth if self.deepest_first else 0
            heapq.heappush(self._heap, (self.stamp.get(node, 0), depth, node.id, node))
            if len(self._heap) > 2 * len(self.stamp) + 64:  # stale entries of past touches
                self._compact()

    def _touch(self, nodes: Iterable[Node], now: int) -> None:
        for node in nodes:
            self.stamp[node] = now
            if not node.children:  # only leaves enter the heap (a path is mostly interior)
                self.changed(node)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self._touch(path, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        self._touch(path, now)

    def _valid(self, entry: HeapEntry) -> bool:
        t, _, _, node = entry
        return (node.parent is not None and not node.children and not node.pins  # live leaf
                and self.stamp.get(node, 0) == t)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        heap, stamp = self._heap, self.stamp
        while heap:  # `lazy_min`'s first loop, `_valid` inlined: a round of block
            t, _, _, node = heap[0]  # evictions drops the last victim's entry per call
            if (node.parent is not None and not node.children and not node.pins
                    and stamp.get(node, 0) == t):
                break
            heapq.heappop(heap)
        if not heap:
            entry = None
        elif node in protected:  # rare: search past the protected ones
            entry = lazy_min(heap, self._valid, protected)
        else:
            entry = heap[0]
        if len(heap) > 64 and len(heap) > 4 * len(stamp):
            self._compact()
        return Victim(entry[3], REMOVE) if entry is not None else None

    def _compact(self) -> None:
        self._heap = compact(self._heap, self._valid)

    def check(self, nodes: Sequence[Node]) -> None:
        valid = {entry[3] for entry in self._heap if self._valid(entry)}
        for node in nodes:
            if node.is_leaf and not node.pins:
                assert node in valid, f"leaf {node!r} missing from the LRU heap"


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
