"""`check_integrity(cache)`: assert every invariant of a `PrefixCache` (a full walk).

For tests and debugging only: it walks the whole tree, which the cache itself never
does per request. The tree's structure, the byte books under the cache's layout (pages,
page copies, the state-slot pool) and the pins are checked here; each eviction policy
checks its own books (`Eviction.check`).
"""

from __future__ import annotations

from marconi.core.cache import PrefixCache


def check_integrity(cache: PrefixCache) -> None:
    """Raise AssertionError naming the first broken invariant (a compiled cache checks
    its own books, `CompiledCache.check`)."""
    if getattr(cache, "compiled", False):
        cache.check()  # type: ignore[attr-defined]
        assert cache.stats.evicted_then_refused == 0, "a refused commit evicted entries first"
        return
    cache.tree.check()
    nodes = cache.tree.nodes()
    _check_books(cache, nodes)
    pinned = {node for node in nodes if node.pins}
    assert cache.pinned == pinned, f"pinned set differs: {cache.pinned ^ pinned}"
    assert cache.stats.evicted_then_refused == 0, "a refused commit evicted entries first"
    for node in nodes:
        assert node.pins >= 0, f"{node!r} has negative pins"
        for child in node.children.values():
            assert child.pins <= node.pins, f"{child!r} pinned more than its parent"
    cache.eviction.check(nodes)


def _check_books(cache: PrefixCache, nodes: list) -> None:
    spec, stats, layout = cache.spec, cache.stats, cache.layout
    kv = sum(cache.books.kv_bytes(node) for node in nodes)
    states = sum(node.has_state for node in nodes)
    ssm = states * spec.ssm_bytes
    assert stats.kv_bytes == kv, f"KV bytes counted {stats.kv_bytes}, held {kv}"
    assert stats.ssm_bytes == ssm, f"SSM bytes counted {stats.ssm_bytes}, held {ssm}"
    assert stats.states == states, f"states counted {stats.states}, held {states}"
    held = stats.bytes + cache.reserved_kv + cache.reserved_states * spec.ssm_bytes
    assert held <= cache.capacity, f"{held} bytes held (reservations too) over capacity " \
        f"{cache.capacity}"
    assert stats.peak_bytes >= stats.bytes, "peak below current bytes"
    if layout.pooled:
        kv += cache.reserved_kv
        states += cache.reserved_states
        assert kv <= cache.kv_capacity, f"{kv} KV bytes over the KV budget {cache.kv_capacity}"
        assert states <= layout.state_slots, f"{states} states in {layout.state_slots} slots"
    alive = set(nodes)
    for node in cache.books.copies:
        assert node in alive, f"page copy kept for {node!r}, no longer in the tree"
        start = node.depth - node.edge_len
        assert start % layout.page_size, f"{node!r} copies a page it starts at the edge of"
