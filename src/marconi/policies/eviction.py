"""Eviction: which entries leave when bytes exceed capacity (DESIGN section 3).

A policy keeps its own bookkeeping (stamps, candidate sets) and is told about every
change the cache makes to the tree. Choosing a victim (`victim`) is separate from
evicting it (the cache does that, then reports the changes back).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import numpy as np

from marconi.policies.slots import Slots
from marconi.spec import ModelSpec
from marconi.tree import Node


class Action(Enum):
    REMOVE = "remove"  # a leaf: free its KV and state, detach it
    MERGE = "merge"  # one child: free its state, its edge's KV moves into the child
    DROP_STATE = "drop-state"  # free the state only; the node stays with its KV


@dataclass(frozen=True, slots=True)
class Victim:
    node: Node
    action: Action


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """Bytes held and bytes a pending insert needs, told to the policy before each victim
    choice (policies with separate KV and state budgets pick the list to evict from)."""

    kv_held: int
    ssm_held: int
    kv_need: int = 0
    ssm_need: int = 0
    capacity: int


def alive(node: Node) -> bool:
    return node.parent is not None


HeapEntry = tuple[float, int, int, Node]  # (stamp, tie-break, node id, node)


def lazy_min(heap: list[HeapEntry], valid: Callable[[HeapEntry], bool],
             protected: Collection[Node]) -> HeapEntry | None:
    """The smallest valid entry of a lazy heap whose node is not protected, or None.

    Stale entries popped on the way are dropped; protected ones go back. The entry found
    stays in the heap (valid until the cache evicts its node).
    """
    held, found = [], None
    while heap:
        entry = heapq.heappop(heap)
        if not valid(entry):
            continue
        if entry[3] in protected:
            held.append(entry)
            continue
        found = entry
        heapq.heappush(heap, entry)
        break
    for entry in held:
        heapq.heappush(heap, entry)
    return found


class Eviction(ABC):
    """Base: last-access stamps per node, event hooks, victim choice."""

    def __init__(self) -> None:
        self.stamp: dict[Node, float] = {}  # last access (clock ticks or a level)

    # --- events (the cache calls these) ------------------------------------------------

    @abstractmethod
    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        """A lookup matched `path` and will resume from `hit`."""

    @abstractmethod
    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        """A commit inserted a sequence along `path`, creating the nodes in `new`."""

    @abstractmethod
    def changed(self, node: Node) -> None:
        """`node`'s edge, state, children or pins changed."""

    def removed(self, node: Node) -> None:
        """`node` left the tree (evicted or merged away)."""
        self.stamp.pop(node, None)

    @abstractmethod
    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        """The next entry to evict, never a pinned or protected one; None if none."""

    def pressure(self, pressure: Pressure) -> None:
        """Told before each `victim` call during an eviction round (default: ignored)."""
        return None

    def garbage(self, protected: Collection[Node]) -> Victim | None:
        """An entry to evict now whatever the byte budget, never a pinned or protected one
        (e.g. a leaf left without state that no lookup can use); None: nothing."""
        return None

    def restore(self, stamps: dict[Node, float]) -> None:
        """Load stamps from a snapshot (nodes must already be in the tree)."""
        for node, t in stamps.items():
            self.stamp[node] = t
            self.changed(node)


class LRULeaf(Eviction):
    """Leaves only, least recently used first (SGLang+ of the paper; vLLM+ with
    `deepest_first`, where blocks touched together leave tail first).

    A lookup or commit touches every node on the path. Lazy heap: stale entries are
    skipped when popped.
    """

    def __init__(self, *, deepest_first: bool = False) -> None:
        super().__init__()
        self.deepest_first = deepest_first
        self._heap: list[HeapEntry] = []

    def _push(self, node: Node) -> None:
        if node.is_leaf and not node.pins and alive(node):
            depth = -node.depth if self.deepest_first else 0
            heapq.heappush(self._heap, (self.stamp.get(node, 0), depth, node.id, node))

    def _touch(self, nodes: Iterable[Node], now: int) -> None:
        for node in nodes:
            self.stamp[node] = now
            self._push(node)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self._touch(path, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        self._touch(path, now)

    def changed(self, node: Node) -> None:
        self._push(node)

    def _valid(self, entry: HeapEntry) -> bool:
        t, _, _, node = entry
        return (alive(node) and node.is_leaf and not node.pins
                and self.stamp.get(node, 0) == t)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        entry = lazy_min(self._heap, self._valid, protected)
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self.stamp):
            self._compact()
        return Victim(entry[3], Action.REMOVE) if entry is not None else None

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._valid(e)]
        heapq.heapify(self._heap)


class Recency(Enum):
    TIME = "time"  # last access time (the paper)
    INVERSE_AGE = "inverse-age"  # 1 / (now - t + 1) (the artifact's variant)
    GREEDY_DUAL = "greedy-dual"  # the inflation level at the last access (marconi+)


class FlopAware(Eviction):
    """Marconi: score S(v) = recency(v) + alpha * eff(v), lowest evicted first.

    Candidates are unpinned nodes with at most one child. Both terms are min-max
    normalized over the current candidates (all equal -> 1) and recomputed for every
    victim. `eff(v) = (F(len(v)) - F(len(parent))) / bytes(v)`. Only the node a lookup
    hits is touched; a commit stamps the nodes it creates.

    Candidates live in dense numpy columns (`Slots`: `rec` the last touch, `eff` the
    efficiency), so a victim among 10^4 candidates is a handful of vector operations.

    `Recency.GREEDY_DUAL` turns this into GreedyDual-Size (Young's Landlord) with the
    FLOPs a node saves as its cost: S(v) = L(v) + eff(v), unnormalized, where L(v) is the
    inflation level when v was last touched, and every victim raises the level to its
    own score. Entries age out as the level passes them, efficient ones later; the order
    is scale-free, so there is no alpha to tune (alpha is ignored).
    """

    COLUMNS: ClassVar[dict[str, type]] = {"rec": np.float64, "eff": np.float64}  # per slot

    def __init__(self, spec: ModelSpec, alpha: float = 0.0,
                 recency: Recency = Recency.TIME) -> None:
        super().__init__()
        self.spec = spec
        self.alpha = check_alpha(alpha)
        self.recency = Recency(recency)
        self.slots = Slots(self.COLUMNS)
        self.level = 0.0  # GreedyDual's inflation level (only used by GREEDY_DUAL)

    def _time(self, now: int) -> float:
        """What a touch stamps: the clock, or GreedyDual's level."""
        return self.level if self.recency is Recency.GREEDY_DUAL else now

    def set_alpha(self, alpha: float) -> None:
        self.alpha = check_alpha(alpha)

    def efficiency(self, node: Node) -> float:
        """Prefill FLOPs the node saves over its parent, per byte it holds."""
        parent_depth = node.parent.depth if node.parent is not None else 0
        held = (self.spec.kv_bytes_per_token * node.edge_len
                + (self.spec.ssm_bytes if node.has_state else 0))
        saved = self.spec.flops(node.depth) - self.spec.flops(parent_depth)
        return saved / held if held else 0.0

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        if hit is not None:
            self.stamp[hit] = self._time(now)
            self.changed(hit)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = self._time(now)
            self.changed(node)

    def changed(self, node: Node) -> None:
        slots = self.slots
        if alive(node) and not node.pins and len(node.children) <= 1:
            slot = slots.index.get(node)
            if slot is None:
                slot = slots.add(node)
            slots["rec"][slot] = self.stamp.get(node, 0)
            slots["eff"][slot] = self.efficiency(node)
        elif node in slots:
            slots.drop(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        if node in self.slots:
            self.slots.drop(node)

    def scores(self, now: int) -> np.ndarray:
        """S(v) for every candidate, in slot order."""
        n = len(self.slots)
        rec, eff = self.slots["rec"][:n], self.slots["eff"][:n]
        if self.recency is Recency.GREEDY_DUAL:
            return rec + eff
        if self.recency is Recency.INVERSE_AGE:
            rec = 1.0 / (now - rec + 1.0)
        return _minmax(rec) + self.alpha * _minmax(eff)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if not self.slots:
            return None
        score = self.scores(now)
        for node in protected:
            slot = self.slots.index.get(node)
            if slot is not None:
                score[slot] = np.inf
        slot = int(np.argmin(score))
        if not np.isfinite(score[slot]):
            return None
        node = self.slots.nodes[slot]
        if self.recency is Recency.GREEDY_DUAL:
            self.level = max(self.level, float(score[slot]))
        return Victim(node, Action.REMOVE if node.is_leaf else Action.MERGE)

    def candidates(self) -> list[Node]:
        return list(self.slots.nodes)


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(), x.max()
    if hi > lo:
        return (x - lo) / (hi - lo)
    return np.ones_like(x)


def check_alpha(alpha: float) -> float:
    if not isinstance(alpha, int | float) or not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)
