"""Eviction mechanics of `PrefixCache`: free what the policy chooses, keep books exact.

A mixin so that `cache.py` reads as the request's life (lookup, commit, pins); the policy
(`marconi.core.policy.Eviction`) chooses victims, this carries them out.
"""

from __future__ import annotations

from collections.abc import Callable

from marconi.core.policy import Action, Eviction, Pressure, Victim
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, StateStore
from marconi.core.stats import CacheStats
from marconi.core.tree import Node, RadixTree


class Evicting:
    """Needs the attributes below (set by `PrefixCache.__init__`)."""

    spec: ModelSpec
    capacity: int
    tree: RadixTree
    stats: CacheStats
    eviction: Eviction
    store: StateStore
    clock: int
    on_evict: Callable[[Freed], None] | None


    def evict(self, nbytes: int) -> int:
        """Free at least `nbytes` if possible (may free more); returns bytes freed.

        evict(0) is always safe and does nothing.
        """
        before = self.stats.bytes
        self._evict_until(before - nbytes, set())
        return before - self.stats.bytes

    def _evict_until(self, target: int, protected: set[Node], kv_need: int = 0,
                     ssm_need: int = 0) -> bool:
        while self.stats.bytes > target:
            self.eviction.pressure(Pressure(kv_held=self.stats.kv_bytes, kv_need=kv_need,
                                            ssm_held=self.stats.ssm_bytes, ssm_need=ssm_need,
                                            capacity=self.capacity))
            victim = self.eviction.victim(protected, self.clock)
            if victim is None:
                return False
            self._evict(victim)
            self._collect_garbage(protected)
        return True

    def _collect_garbage(self, protected: set[Node]) -> None:
        """Evict what the policy says must go whatever the budget (e.g. stateless leaves)."""
        while (victim := self.eviction.garbage(protected)) is not None:
            self._evict(victim)

    def _evict(self, victim: Victim, *, replaced: bool = False) -> None:
        """Carry out `victim`; `replaced`: the state was superseded by a commit, not
        evicted for room (counted as `states_replaced`)."""
        node, action = victim.node, victim.action
        state_bytes = self.spec.ssm_bytes if node.has_state else 0
        state = node.state if node.has_state else None  # released even when it holds 0 B
        kv, kv_bytes = None, 0
        node.has_state, node.state = False, None
        if action is Action.REMOVE:
            kv, kv_bytes = node.kv, node.edge_len * self.spec.kv_bytes_per_token
            parent = node.parent
            self.tree.remove_leaf(node)
            self.eviction.removed(node)
            if parent is not None and parent is not self.tree.root:
                self.eviction.changed(parent)
        elif action is Action.MERGE:
            (child,) = node.children.values()
            child_kv = child.kv
            self.tree.merge_into_child(node)
            child.kv = self.store.kv_join(node.kv, child_kv)
            self.eviction.removed(node)
            self.eviction.changed(child)
        else:
            self.eviction.changed(node)
        if action is not Action.DROP_STATE:
            node.kv = None  # detached: policies may still hold the node object for a while
        self.store.release(kv, state)
        if replaced:
            self.stats.record_replacement(state_bytes)
        else:
            self.stats.record_eviction(kv_bytes, state_bytes)
        if self.on_evict is not None:
            self.on_evict(Freed(action, node.depth, kv, state, kv_bytes + state_bytes))
