"""`Ranked`: a declared `Priority` (marconi.core.priority) run on the Python core.

Each candidate's key is computed from its features whenever the cache reports a change
to it and pushed on a lazy heap with the key it was pushed at; an entry whose node is no
longer a candidate, or whose key changed since, is stale and skipped when it surfaces
(the LRU mechanics of `marconi.core.lazy_heap`, over a tuple key). A cache rebuilt from
a snapshot (`marconi.core.snapshot`: structure and stamps) starts every node's hit count
and creation clock at 0, on either core.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from marconi.core.books import CoreBooks
from marconi.core.policy import Action, Eviction, Victim, alive
from marconi.core.priority import Feature, Priority, key_function
from marconi.core.tree import Node

Entry = tuple[tuple[float, ...], int, Node]  # (key, node id, node)
# the features whose books (`hits`, `created`) each commit keeps
COUNTED = frozenset({Feature.HITS, Feature.CREATED})


def _candidate(node: Node) -> bool:
    """A live unpinned leaf (`Candidates.LEAVES`)."""
    return not node.children and not node.pins and alive(node)


class Ranked(Eviction):
    """Evicts the candidate whose declared key is lowest; ties by creation order."""

    compiled_as = "ranked"  # the compiled core evaluates declarations of up to two keys

    def core_books(self) -> CoreBooks:
        return CoreBooks(keys=self.priority)

    def __init__(self, priority: Priority) -> None:
        super().__init__()
        self.priority = priority
        # hit counts and creation clocks are kept only where a key reads one (nothing else
        # reads them)
        self._counts = bool(COUNTED & priority.features)
        self.hits: dict[Node, int] = {}
        self.created: dict[Node, float] = {}
        self._key: dict[Node, tuple[float, ...]] = {}
        self._heap: list[Entry] = []
        self._key_of: Callable[[Node], tuple[float, ...]] | None = None  # (`key`)

    def __getstate__(self) -> dict[str, Any]:
        """Its state without the key function, which reads this instance's books: a copy
        or an unpickled one builds its own (`key`)."""
        state = self.__dict__.copy()
        state["_key_of"] = None
        return state

    def key(self, node: Node) -> tuple[float, ...]:
        """`node`'s keys, each summed as `key_value` sums it (`key_function`, built once
        over the instance's books: a node's last touch, depth, hits, creation clock and
        whether it holds a state)."""
        key_of = self._key_of
        if key_of is None:
            stamp, hits, created = self.stamp, self.hits, self.created
            read: dict[Feature, Callable[[Node], float]] = {
                Feature.RECENCY: lambda n: stamp.get(n, 0),
                Feature.DEPTH: lambda n: n.depth,
                Feature.HITS: lambda n: hits.get(n, 0),
                Feature.CREATED: lambda n: created.get(n, 0),
                Feature.STATE: lambda n: 1.0 if n.has_state else 0.0}
            key_of = self._key_of = key_function(self.priority.keys, read)
        return key_of(node)

    # --- events ---------------------------------------------------------------------

    def changed(self, node: Node) -> None:
        if _candidate(node):
            key = self.key(node)
            if self._key.get(node) != key:
                self._key[node] = key
                heapq.heappush(self._heap, (key, node.id, node))
                if len(self._heap) > 2 * len(self._key) + 64:
                    self._compact()
        else:
            self._key.pop(node, None)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.hits.pop(node, None)
        self.created.pop(node, None)
        self._key.pop(node, None)

    def _touch(self, nodes: Iterable[Node], now: int) -> None:
        for node in nodes:
            self.stamp[node] = now
            if not node.children:  # (an inner node has no key: it lost it, reported
                self.changed(node)  # changed, when it gained its first child)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self._touch(path, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        # deepest first, a split's upper half keeping its first child's count and creation
        # (that child is the split's lower half, or a deeper upper half set just before)
        if not self._counts:
            self._touch(path, now)
            return
        for node in sorted(new, key=lambda n: -n.depth):
            child = next(iter(node.children.values()), None)
            self.hits[node] = self.hits.get(child, 0) if child is not None else 0
            self.created[node] = self.created.get(child, now) if child is not None else now
        path = list(path)
        for node in path:
            self.hits[node] = self.hits.get(node, 0) + 1
        self._touch(path, now)

    # --- victims --------------------------------------------------------------------

    def _valid(self, entry: Entry) -> bool:
        key, _, node = entry
        return _candidate(node) and self._key.get(node) == key

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return None
        if heap[0][2] not in protected:
            return Victim(heap[0][2], Action.REMOVE)
        held, found = [], None
        while heap:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            held.append(entry)
            if entry[2] not in protected:
                found = entry[2]
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return Victim(found, Action.REMOVE) if found is not None else None

    def _compact(self) -> None:
        best: dict[int, Entry] = {}
        for entry in self._heap:
            if self._valid(entry):
                best[entry[1]] = entry
        self._heap = list(best.values())
        heapq.heapify(self._heap)

    def check(self, nodes: Sequence[Node]) -> None:
        valid = {entry[2] for entry in self._heap if self._valid(entry)}
        for node in nodes:
            if _candidate(node):
                assert node in valid, (
                    f"candidate {node!r} missing from the {self.priority.name} heap")
                assert self._key[node] == self.key(node), f"stale key for {node!r}"
