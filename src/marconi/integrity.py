"""`check_integrity(cache)`: assert every invariant of a `PrefixCache` (a full walk).

For tests and debugging only: it walks the whole tree, which the cache itself never
does per request.
"""

from __future__ import annotations

from marconi.cache import PrefixCache
from marconi.policies import FlopAware, LRULeaf
from marconi.policies.density import HitDensity
from marconi.policies.mamba_radix import MambaRadixLRU
from marconi.policies.plus import Switchable
from marconi.policies.two_lists import TwoListLRU


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
    for node in nodes:
        assert node.pins >= 0, f"{node!r} has negative pins"
        for child in node.children.values():
            assert child.pins <= node.pins, f"{child!r} pinned more than its parent"
    if isinstance(cache.eviction, FlopAware):
        _check_flop_aware(cache.eviction, nodes)
        if isinstance(cache.eviction, Switchable):  # marconi+: its twins too
            _check_lru(cache.eviction.lru, nodes)
            _check_flop_aware(cache.eviction.density, nodes)
            if cache.eviction.depth is not None:
                _check_flop_aware(cache.eviction.depth, nodes)
    elif isinstance(cache.eviction, LRULeaf):
        _check_lru(cache.eviction, nodes)
    elif isinstance(cache.eviction, TwoListLRU):
        _check_two_lists(cache.eviction, nodes)


def _check_flop_aware(policy: FlopAware, nodes: list) -> None:
    expected = {n for n in nodes if not n.pins and len(n.children) <= 1}
    got = set(policy.candidates())
    assert got == expected, f"candidates differ: extra {got - expected}, missing {expected - got}"
    for node in got:
        slots, slot = policy.slots, policy.slots.index[node]
        assert slots.nodes[slot] is node, f"{node!r} is not in its slot"
        assert slots["eff"][slot] == policy.efficiency(node), f"stale efficiency for {node!r}"
        assert slots["rec"][slot] == policy.stamp.get(node, 0), f"stale recency for {node!r}"
        if isinstance(policy, HitDensity):
            assert slots["cls"][slot] == policy.classify(node), f"stale class for {node!r}"


def _check_lru(policy: LRULeaf, nodes: list) -> None:
    valid = {entry[3] for entry in policy._heap if policy._valid(entry)}
    for node in nodes:
        if node.is_leaf and not node.pins:
            assert node in valid, f"leaf {node!r} missing from the LRU heap"


def _check_two_lists(policy: TwoListLRU, nodes: list) -> None:
    kv, states = policy.kv.members(), policy.states.members()
    stamped = set(policy.state_stamp)
    for node in nodes:
        if node.is_leaf and not node.pins:
            assert node in kv, f"leaf {node!r} missing from the KV list"
        if node.has_state and not node.pins:
            assert node in states, f"state of {node!r} missing from the state list"
        assert (node in stamped) == node.has_state, f"state stamp of {node!r} out of step"
    assert stamped <= set(nodes), "state stamps kept for nodes no longer in the tree"
    if isinstance(policy, MambaRadixLRU):
        for node in nodes:
            if node.is_leaf and not node.has_state and not node.pins:
                assert node in policy.tombstones, f"stateless leaf {node!r} not queued"
