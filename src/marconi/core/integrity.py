"""`check_integrity(cache)`: assert every invariant of a `PrefixCache` (a full walk).

For tests and debugging only: it walks the whole tree, which the cache itself never
does per request. The tree's structure and the byte books are checked here; each
eviction policy checks its own books (`Eviction.check`).
"""

from __future__ import annotations

from marconi.core.cache import PrefixCache


def check_integrity(cache: PrefixCache) -> None:
    """Raise AssertionError naming the first broken invariant."""
    cache.tree.check()
    nodes = cache.tree.nodes()
    spec = cache.spec
    kv = sum(node.edge_len for node in nodes) * spec.kv_bytes_per_token
    ssm = sum(node.has_state for node in nodes) * spec.ssm_bytes
    assert cache.stats.kv_bytes == kv, f"KV bytes counted {cache.stats.kv_bytes}, held {kv}"
    assert cache.stats.ssm_bytes == ssm, f"SSM bytes counted {cache.stats.ssm_bytes}, held {ssm}"
    assert cache.stats.bytes <= cache.capacity, (
        f"{cache.stats.bytes} bytes held over capacity {cache.capacity}")
    assert cache.stats.peak_bytes >= cache.stats.bytes, "peak below current bytes"
    pinned = {node for node in nodes if node.pins}
    assert cache.pinned == pinned, f"pinned set differs: {cache.pinned ^ pinned}"
    assert cache.stats.evicted_then_refused == 0, "a refused commit evicted entries first"
    for node in nodes:
        assert node.pins >= 0, f"{node!r} has negative pins"
        for child in node.children.values():
            assert child.pins <= node.pins, f"{child!r} pinned more than its parent"
    cache.eviction.check(nodes)
