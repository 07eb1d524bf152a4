"""A lazy min-heap of nodes: entries go stale instead of being removed (LRU mechanics).

Policies that order nodes by a stamp push a fresh entry on every touch and let
`lazy_min` skip entries whose stamp no longer matches when they surface; `compact`
bounds the heap when stale entries pile up.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection

from marconi.core.tree import Node

HeapEntry = tuple[float, int, int, Node]  # (stamp, tie-break, node id, node)


def lazy_min(heap: list[HeapEntry], valid: Callable[[HeapEntry], bool],
             protected: Collection[Node]) -> HeapEntry | None:
    """The smallest valid entry of a lazy heap whose node is not protected, or None.

    Stale entries popped on the way are dropped; protected ones go back. The entry found
    stays in the heap (valid until the cache evicts its node).
    """
    while heap and not valid(heap[0]):
        heapq.heappop(heap)
    if not heap or heap[0][3] not in protected:  # the usual case: read the top in place
        return heap[0] if heap else None
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


def compact(heap: list[HeapEntry], valid: Callable[[HeapEntry], bool]) -> list[HeapEntry]:
    """A heap of the valid entries only, one per node: the smallest, the one a search
    surfaces first (a node pushed again at an unchanged stamp has several valid entries;
    kept, they would fill the heap past any bound and force a compaction on every push)."""
    best: dict[int, HeapEntry] = {}
    for entry in heap:
        kept = best.get(entry[2])
        if (kept is None or entry[:2] < kept[:2]) and valid(entry):
            best[entry[2]] = entry
    out = list(best.values())
    heapq.heapify(out)
    return out
