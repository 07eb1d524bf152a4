"""Eviction mechanics of `PrefixCache`: make room, free what the policy chooses, keep the
books exact.

A mixin so that `cache.py` reads as the request's life (lookup, commit, pins); the policy
(`marconi.core.policy.Eviction`) chooses victims, this carries them out against the cache's
layout (`marconi.core.layout`): one byte budget, or KV pages beside a state-slot pool.
Feasibility comes before any eviction (docs/architecture.md, "Eviction").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from marconi.core.layout import Layout, PageBooks
from marconi.core.policy import Action, Eviction, Pressure, Victim, overrides
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, StateStore
from marconi.core.stats import CacheStats
from marconi.core.tree import Match, Node, RadixTree

# Read per victim: a module global is a dict lookup, an enum member through its class is
# a descriptor call.
REMOVE, MERGE, DROP_STATE = Action.REMOVE, Action.MERGE, Action.DROP_STATE


@dataclass(frozen=True, slots=True)
class Need:
    """What a pending insert adds: KV bytes (whole pages when paged) and states."""

    kv: int
    states: int


class Evicting:
    """Needs the attributes below (set by `PrefixCache.__init__`)."""

    spec: ModelSpec
    ssm_bytes: int  # one state's bytes: `spec.ssm_bytes`, read once (the spec is frozen)
    capacity: int
    kv_capacity: int  # capacity less the state pool (all of it without a pool)
    layout: Layout
    books: PageBooks
    tree: RadixTree
    stats: CacheStats
    eviction: Eviction
    store: StateStore
    clock: int
    pinned: set[Node]
    on_evict: Callable[[Freed], None] | None

    # held beside the tree by running requests (`reserve`): KV bytes and working states
    reserved_kv: int = 0
    reserved_states: int = 0

    def reserve(self, kv: int, states: int = 0) -> bool:
        """Hold `kv` bytes of KV and `states` states beside the tree, in the same
        capacity: what a running request holds before its commit (the serving replay,
        `marconi.core.serving`). Evicts until the tree fits beside every reservation; False,
        with nothing reserved or evicted, where the pinned entries and the reservations
        leave no room even with every unpinned entry gone."""
        if kv < 0 or states < 0:
            raise ValueError(f"reserve: kv={kv!r} and states={states!r} must be >= 0")
        self.reserved_kv += kv
        self.reserved_states += states
        if not self._feasible(Need(0, 0), set()):
            self.reserved_kv -= kv
            self.reserved_states -= states
            return False
        if self._evict_while(self._short_of(Need(0, 0)), set(), Need(0, 0)):
            return True
        self.reserved_kv -= kv  # the policy could not reach the floor: give it back
        self.reserved_states -= states
        self.stats.evicted_then_refused += 1
        return False

    def release(self, kv: int, states: int = 0) -> None:
        """Give back what `reserve` held."""
        if not (0 <= kv <= self.reserved_kv and 0 <= states <= self.reserved_states):
            raise ValueError(f"release: kv={kv!r}, states={states!r} is more than was "
                             f"reserved ({self.reserved_kv}, {self.reserved_states})")
        self.reserved_kv -= kv
        self.reserved_states -= states

    @property
    def reserved(self) -> tuple[int, int]:
        """(KV bytes, states) held beside the tree by `reserve`."""
        return self.reserved_kv, self.reserved_states

    def evict(self, nbytes: int) -> int:
        """Free at least `nbytes` if possible (may free more); returns bytes freed.

        evict(0) is always safe and does nothing. Pinned entries stay.
        """
        before = self.stats.bytes
        self._evict_while(lambda: self.stats.bytes > before - nbytes, set(), Need(0, 0))
        return before - self.stats.bytes

    def fits(self, need: Need) -> bool:
        """Whether `need` fits beside what is held now (no side effects)."""
        return not self._short_of(need)()

    def floor(self, protected: Collection[Node] = ()) -> int:
        """Bytes no eviction can free: pinned nodes and `protected` ones (KV and state)."""
        kept = self.pinned.union(protected)
        return sum(self.books.kv_bytes(node) for node in kept) \
            + sum(node.has_state for node in kept) * self.ssm_bytes

    def _make_room(self, match: Match, n: int, states: int) -> bool:
        """Evict until `n` tokens (`match.length` of them in the tree) and `states` new
        states fit; False, with nothing evicted, if they could not fit even with every
        unpinned entry beside the path gone."""
        need = Need(self.books.need(match, n), states)
        if self.fits(need):
            return True
        protected = set(match.path)
        if match.partial is not None:
            protected.add(match.partial)
        if not self._feasible(need, protected):
            return False
        if self._evict_while(self._short_of(need), protected, need):
            return True
        self.stats.evicted_then_refused += 1  # a policy that could not reach the floor
        return False

    def _short_of(self, need: Need) -> Callable[[], bool]:
        """Whether the cache is still short of room for `need`, as one call with the budget
        worked out once (a round asks it once per victim, and can take a victim per block);
        the one statement of the budgets (`fits` is its negation)."""
        s = self.stats
        kv_need, states_need = need.kv + self.reserved_kv, need.states + self.reserved_states
        if not self.layout.pooled:
            limit = self.capacity - kv_need - states_need * self.ssm_bytes
            return lambda: s.kv_bytes + s.ssm_bytes > limit
        kv_limit = self.kv_capacity - kv_need
        state_limit = self.layout.state_slots - states_need
        return lambda: s.kv_bytes > kv_limit or s.states > state_limit

    def _feasible(self, need: Need, protected: set[Node]) -> bool:
        kept = self.pinned.union(protected)
        kv = sum(self.books.kv_bytes(node) for node in kept) + need.kv + self.reserved_kv
        states = sum(node.has_state for node in kept) + need.states + self.reserved_states
        if not self.layout.pooled:
            return kv + states * self.ssm_bytes <= self.capacity
        return kv <= self.kv_capacity and states <= self.layout.state_slots

    def _evict_while(self, short: Callable[[], bool], protected: set[Node], need: Need) -> bool:
        """Evict the policy's victims while `short()`; False if the policy runs out.

        The hooks a policy leaves at their default (`pressure`, `garbage`) are not called:
        a round can take a victim per block of a long sequence, each one counts."""
        eviction, evict, clock = self.eviction, self._evict, self.clock
        listens, collects = overrides(eviction, "pressure"), overrides(eviction, "garbage")
        choose = eviction.victim
        while short():
            if listens:
                eviction.pressure(self._pressure(need))
            victim = choose(protected, clock)
            if victim is None:
                return False
            evict(victim)
            if collects:
                self._collect_garbage(protected)
        return True

    def _pressure(self, need: Need) -> Pressure:
        ssm = self.ssm_bytes
        return Pressure(
            kv_held=self.stats.kv_bytes, kv_need=need.kv, ssm_held=self.stats.ssm_bytes,
            ssm_need=need.states * ssm, capacity=self.kv_capacity,
            ssm_capacity=self.layout.state_slots * ssm if self.layout.pooled else None)

    def _collect_garbage(self, protected: set[Node]) -> None:
        """Evict what the policy says must go whatever the budget (e.g. stateless leaves)."""
        while (victim := self.eviction.garbage(protected)) is not None:
            self._evict(victim)

    def _evict(self, victim: Victim, *, replaced: bool = False) -> None:
        """Carry out `victim`; `replaced`: the state was superseded by a commit, not
        evicted for room (counted as `states_replaced`)."""
        node, action = victim.node, victim.action
        had_state = node.has_state
        state_bytes = self.ssm_bytes if had_state else 0
        state = node.state if had_state else None  # released even when it holds 0 B
        kv, kv_bytes = None, 0
        node.has_state, node.state = False, None
        if action is REMOVE:  # detach the leaf (a round can take one per block: inline)
            kv, kv_bytes = node.kv, self.books.kv_bytes(node)
            parent = node.parent
            self.books.removed(node)
            self.tree.remove_leaf(node)
            self.eviction.removed(node)
            if parent is not None and parent.parent is not None:  # not a namespace's root
                self.eviction.changed(parent)
        elif action is MERGE:
            kv_bytes = self._merge(node)
        else:
            self.eviction.changed(node)
        if action is not DROP_STATE:
            node.kv = None  # detached: policies may still hold the node object for a while
        self.store.release(kv, state)
        if replaced:
            self.stats.record_replacement(state_bytes, kv=kv_bytes)
        else:
            self.stats.record_eviction(kv_bytes, state_bytes, state=had_state)
        if self.on_evict is not None:
            self.on_evict(Freed(action, node.depth, kv, state, kv_bytes + state_bytes))

    def _merge(self, node: Node) -> int:
        """Merge `node` into its only child; returns the KV bytes freed (a page copy)."""
        (child,) = node.children.values()
        child_kv = child.kv
        freed = self.books.merge(node, child)
        self.tree.merge_into_child(node)
        child.kv = self.store.kv_join(node.kv, child_kv)
        self.eviction.removed(node)
        self.eviction.changed(child)
        return freed
