"""Picklable copies of a cache's tree, for replays in other processes (the tuner).

`take` copies a cache; `rebuild` fills an empty cache, built with whatever policies the
replay runs, with the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from marconi.core.cache import PrefixCache
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Structure, states and stamps of a cache; no handles, no pins."""

    spec: ModelSpec
    capacity: int
    clock: int
    parents: tuple[int, ...]  # index of each node's parent in this list, -1 for the root
    keys: tuple[bytes, ...]  # edges, int32 bytes
    has_state: tuple[bool, ...]
    stamps: tuple[float, ...]  # last access as the eviction policy knew it (0: never)


def take(cache: PrefixCache) -> Snapshot:
    """Copy `cache`'s tree (a full walk: called once per tuning, not per request)."""
    nodes = cache.tree.nodes()
    index = {node: i for i, node in enumerate(nodes)}
    stamps = cache.eviction.stamp
    return Snapshot(
        spec=cache.spec, capacity=cache.capacity, clock=cache.clock,
        parents=tuple(index.get(node.parent, -1) for node in nodes),  # type: ignore[arg-type]
        keys=tuple(node.key for node in nodes),
        has_state=tuple(node.has_state for node in nodes),
        stamps=tuple(stamps.get(node, 0) for node in nodes))


def rebuild(snapshot: Snapshot, cache: PrefixCache) -> list[Node]:
    """Fill an empty `cache` with the snapshot's tree, bytes, clock and stamps; returns
    the new nodes in the snapshot's order (for policies with more state to restore)."""
    cache.clock = snapshot.clock
    nodes: list[Node] = []
    for parent, key, has_state in zip(snapshot.parents, snapshot.keys, snapshot.has_state,
                                      strict=True):
        node = cache.tree.insert(nodes[parent] if parent >= 0 else cache.tree.root, key)
        node.has_state = has_state
        nodes.append(node)
    kv = sum(len(k) for k in snapshot.keys) // 4 * snapshot.spec.kv_bytes_per_token
    cache.stats.add_bytes(kv=kv, ssm=sum(snapshot.has_state) * snapshot.spec.ssm_bytes)
    cache.eviction.restore(dict(zip(nodes, snapshot.stamps, strict=True)))
    return nodes
