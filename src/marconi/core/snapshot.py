"""Picklable copies of a cache's tree, for replays in other processes (the tuner), and
whole copies in this one.

`take` copies a cache; `rebuild` fills an empty cache, built with whatever policies the
replay runs, with the copy. `clone` copies a cache with its policies' books (marconi+'s
shadow experts: one that parts from its twin).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

from marconi.core.cache import PrefixCache
from marconi.core.layout import Layout
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node, Salt


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Structure, states, stamps, layout and namespaces of a cache; no handles, no pins."""

    spec: ModelSpec
    capacity: int
    clock: int
    parents: tuple[int, ...]  # index of each node's parent in this list, -1 for the root
    keys: tuple[bytes, ...]  # edges, int32 bytes
    has_state: tuple[bool, ...]
    stamps: tuple[float, ...]  # last access as the eviction policy knew it (0: never)
    layout: Layout = field(default_factory=Layout)  # a replay runs the same layout
    copies: tuple[bool, ...] = ()  # holds its own copy of the page it starts in
    salts: tuple[Salt, ...] = ()  # namespace of each node hung under a root (else None)


def take(cache: PrefixCache) -> Snapshot:
    """Copy `cache`'s tree (a full walk: called once per tuning, not per request); a
    compiled cache (`marconi.core.compiled`) copies its own, in the same order."""
    if getattr(cache, "compiled", False):
        return cache.take()  # type: ignore[attr-defined]
    nodes = cache.tree.nodes()
    index = {node: i for i, node in enumerate(nodes)}
    stamps = cache.eviction.stamp
    return Snapshot(
        spec=cache.spec, capacity=cache.capacity, clock=cache.clock,
        parents=tuple(index.get(node.parent, -1) for node in nodes),  # type: ignore[arg-type]
        keys=tuple(node.key for node in nodes),
        has_state=tuple(node.has_state for node in nodes),
        stamps=tuple(stamps.get(node, 0) for node in nodes), layout=cache.layout,
        copies=tuple(node in cache.books.copies for node in nodes),
        salts=tuple(_salt(cache, node, index) for node in nodes))


def _salt(cache: PrefixCache, node: Node, index: dict[Node, int]) -> Salt:
    """The namespace of a node hung under a root; None for the others (and the default)."""
    parent = node.parent
    return cache.tree.salt_of(parent) if parent is not None and parent not in index else None


def rebuild(snapshot: Snapshot, cache: PrefixCache) -> list[Node]:
    """Fill an empty `cache` (built with the snapshot's layout) with the snapshot's tree,
    bytes, clock and stamps; returns the new nodes in the snapshot's order (for policies
    with more state to restore). A compiled cache loads it (and returns no nodes)."""
    if getattr(cache, "compiled", False):
        cache.load(snapshot)  # type: ignore[attr-defined]
        return []
    cache.clock = snapshot.clock
    nodes: list[Node] = []
    salts = snapshot.salts or (None,) * len(snapshot.keys)
    for parent, key, has_state, salt in zip(snapshot.parents, snapshot.keys,
                                            snapshot.has_state, salts, strict=True):
        node = cache.tree.insert(nodes[parent] if parent >= 0 else cache.tree.namespace(salt),
                                 key)
        node.has_state = has_state
        nodes.append(node)
    cache.books.copies.update(n for n, c in zip(nodes, snapshot.copies, strict=False) if c)
    states = sum(snapshot.has_state)
    cache.stats.add_bytes(kv=sum(cache.books.kv_bytes(n) for n in nodes),
                          ssm=states * snapshot.spec.ssm_bytes, states=states)
    cache.eviction.restore(dict(zip(nodes, snapshot.stamps, strict=True)))
    return nodes


def clone(cache: PrefixCache, shared: Iterable[object] = ()) -> PrefixCache:
    """An independent copy of `cache` with its policies' books, in this process: it
    behaves from here on exactly as `cache` would (node ids, stamps and every policy's
    tables copied), except that the objects in `shared` (a marconi+ shadow's overlap
    planner) are referred to, not copied. For token-only caches (a shadow whose twin parts
    from it); handles are deep-copied as they are. The tree's nodes are copied without
    recursion first, so that a deep tree does not exhaust the interpreter's stack;
    everything else follows them."""
    if getattr(cache, "compiled", False):
        return cache.clone(shared)  # type: ignore[attr-defined]
    memo: dict[int, object] = {id(cache.spec): cache.spec, **{id(o): o for o in shared}}
    olds: list[Node] = []
    stack = list(cache.tree.roots.values())
    while stack:
        node = stack.pop()
        olds.append(node)
        memo[id(node)] = Node.__new__(Node)
        stack.extend(node.children.values())
    for old in olds:
        new = memo[id(old)]
        assert isinstance(new, Node)
        new.key, new.depth, new.has_state, new.pins, new.id = (
            old.key, old.depth, old.has_state, old.pins, old.id)
        new.parent = memo[id(old.parent)] if old.parent is not None else None  # type: ignore[assignment]
        new.children = {first: memo[id(child)] for first, child in old.children.items()}  # type: ignore[misc]
        new.state = copy.deepcopy(old.state, memo)
        new.kv = copy.deepcopy(old.kv, memo)
    return copy.deepcopy(cache, memo)
