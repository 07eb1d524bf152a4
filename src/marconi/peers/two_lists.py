"""Two LRU lists over one tree: one for KV (leaves), one for SSM states (any node).

Today's engines keep the attention KV and the Mamba states in separate pools, each with
its own recency: SGLang's `MambaRadixCache` has a full-KV LRU list and a mamba LRU list,
vLLM's block pool stamps KV blocks and state blocks separately. `TwoListLRU` evaluates
an engine's declaration of them (`core.priority.Lists`: which list gives the next victim,
the tie at equal stamps, whether stateless leaves are garbage, T-LRU's KV order); each
engine's subclass names its declaration (`LISTS`) and nothing else of the lists, and
`FlopStates` evaluates a declared score over the state list (`core.scores.ListScore`).
The compiled core evaluates the same declarations (`Core::set_lists`,
`Core::set_state_score`).

Each list is a lazy heap of `(stamp, tie, id, node)`: an entry is stale once the node's
stamp moved on or the node stopped qualifying, and is skipped when popped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Sequence

import numpy as np

from marconi.core.books import CoreBooks
from marconi.core.candidates import replay_length
from marconi.core.lazy_heap import HeapEntry, compact, lazy_min
from marconi.core.policy import Action, Eviction, Pressure, Victim, alive
from marconi.core.priority import Feature, Lists, ListVictim
from marconi.core.scores import OVER_A_LIST, FlopsAt, ListScore, check_features, order, ranks
from marconi.core.tree import Node

Entry = HeapEntry


def kv_candidate(node: Node) -> bool:
    """A leaf whose KV may leave (removing it frees its state too)."""
    return alive(node) and node.is_leaf and not node.pins


def state_candidate(node: Node) -> bool:
    """A node whose state may leave."""
    return alive(node) and node.has_state and not node.pins


class LazyLRU:
    """One LRU list: stamps per node and a heap that tolerates stale entries."""

    def __init__(self, stamps: dict[Node, float], qualifies: Callable[[Node], bool],
                 shallow_first: bool) -> None:
        self.stamps = stamps  # node -> last access (logical clock)
        self.qualifies = qualifies
        self.shallow_first = shallow_first  # tie at equal stamps: nearer the root goes first
        self.heap: list[Entry] = []

    def touch(self, node: Node, now: int) -> None:
        self.stamps[node] = now
        self.push(node)

    def push(self, node: Node) -> None:
        if self.qualifies(node):
            tie = node.depth if self.shallow_first else -node.depth
            heapq.heappush(self.heap, (self.stamps.get(node, 0), tie, node.id, node))
            if len(self.heap) > 2 * len(self.stamps) + 64:  # stale entries of past touches
                self.heap = compact(self.heap, self.valid)

    def valid(self, entry: Entry) -> bool:
        node = entry[3]
        return self.qualifies(node) and self.stamps.get(node, 0) == entry[0]

    def peek(self, protected: Collection[Node]) -> Entry | None:
        """The least recently used qualifying entry outside `protected` (not removed)."""
        found = lazy_min(self.heap, self.valid, protected)
        if len(self.heap) > 64 and len(self.heap) > 4 * len(self.stamps) + 64:
            self.heap = compact(self.heap, self.valid)
        return found

    def members(self) -> set[Node]:
        """Nodes with a valid entry (tests: every qualifying node must be one)."""
        return {entry[3] for entry in self.heap if self.valid(entry)}


class TwoListLRU(Eviction):
    """An engine's two lists as its class declares them (`LISTS`, a
    `core.priority.Lists`): a KV list (`self.kv`, stamps in `self.stamp`) and a state
    list (`self.states`).

    A state newly gained by an existing node (a tombstone re-admitted) is stamped with
    the clock of the commit that admitted it; a dropped state forgets its stamp. Under
    `ListVictim.SHORT_POOL` states are over their budget past their pool (a cache with
    one) or `state_share` of the one byte budget; with `garbage`, stateless leaves are
    queued (an insertion-ordered set, the last queued collected first).
    """

    LISTS: Lists

    def __init__(self, state_share: float = 0.0) -> None:
        super().__init__()
        self.state_share = state_share
        self.state_stamp: dict[Node, float] = {}
        shallow = self.LISTS.shallow_first
        self.kv = LazyLRU(self.stamp, kv_candidate, shallow)
        self.states = LazyLRU(self.state_stamp, state_candidate, shallow)
        self.tombstones: dict[Node, None] = {}  # leaves seen without a state (garbage)
        self.high: dict[Node, int] = {}  # `tail_safe`: the deepest depth committed below
        self._pressure: Pressure | None = None
        self.now = 0

    def core_books(self) -> CoreBooks:
        """The compiled core's: the declaration, and the states' share of one budget."""
        return CoreBooks(lists=self.LISTS, state_share=self.state_share)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self.now = now
        if hit is not None:
            nodes = list(path)
            self.touch(nodes[: nodes.index(hit) + 1], now, states=False)
            self.states.touch(hit, now)  # only the state the match uses

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        path, new = list(path), list(new)
        if self.LISTS.tail_safe is not None:
            self._high_water(path, new)
        self.now = now
        self.touch(path, now, states=False)  # new states: stamped by `changed`
        if self.LISTS.garbage:
            for node in new:
                self.changed(node)

    def _high_water(self, path: list[Node], new: list[Node]) -> None:
        """`tail_safe`'s marks: a new node (a split's upper half) takes the deepest mark
        below it, then every node on the committed path is raised to the path's end."""
        for node in new:
            below = [self.high.get(c, c.depth) for c in node.children.values()]
            self.high[node] = max([node.depth, *below])
        end = path[-1].depth if path else 0
        for node in path:
            if self.high.get(node, 0) < end:
                self.high[node] = end

    def pressure(self, pressure: Pressure) -> None:
        self._pressure = pressure

    def states_first(self) -> bool:
        """Whether states are over their budget: the slot pool when the cache has one,
        else `state_share` of the one byte budget."""
        p = self._pressure
        if p is None:
            return False
        budget = self.state_share * p.capacity if p.ssm_capacity is None else p.ssm_capacity
        return p.ssm_held + p.ssm_need > budget

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if self.LISTS.victim is ListVictim.OLDER_HEAD:
            kv, state = self.kv.peek(protected), self.states.peek(protected)
            if state is not None and (kv is None or state[:3] <= kv[:3]):
                return self._state_leaving(state[3], protected)
            return Victim(kv[3], Action.REMOVE) if kv is not None else None
        order = (self._state_victim, self._kv_victim)
        for pick in order if self.states_first() else order[::-1]:
            victim = pick(protected)
            if victim is not None:
                return victim
        return None

    def _kv_victim(self, protected: Collection[Node]) -> Victim | None:
        safe = self.LISTS.tail_safe
        if safe is not None:  # the first TEL-safe leaf, least recently used first
            lru, best = self.kv, None
            for entry in lru.heap:
                node = entry[3]
                if node not in protected and lru.valid(entry) \
                        and safe.safe(node.depth - node.edge_len, self.high.get(node, node.depth)) \
                        and (best is None or entry[:3] < best[:3]):
                    best = entry
            if best is not None:
                return Victim(best[3], Action.REMOVE)
        head = self.kv.peek(protected)
        return Victim(head[3], Action.REMOVE) if head else None

    def _state_victim(self, protected: Collection[Node]) -> Victim | None:
        entry = self.states.peek(protected)
        return self._state_leaving(entry[3], protected) if entry is not None else None

    def _state_leaving(self, lru: Node, protected: Collection[Node]) -> Victim:
        """The state list's victim, its head `lru` given: alone, or with its leaf where
        stateless leaves are garbage (it would be garbage at once)."""
        node = self._state_pick(lru, protected)
        leaves = self.LISTS.garbage and node.is_leaf
        return Victim(node, Action.REMOVE if leaves else Action.DROP_STATE)

    def _state_pick(self, lru: Node, protected: Collection[Node]) -> Node:
        """Which state leaves when the state list gives the victim: its head, `lru`."""
        return lru

    def garbage(self, protected: Collection[Node]) -> Victim | None:
        kept, found = [], None
        while self.tombstones and found is None:
            node, _ = self.tombstones.popitem()
            if not (alive(node) and node.is_leaf and not node.has_state and not node.pins):
                continue  # gone, or no longer a stateless leaf; unpinning re-reports it
            if node in protected:
                kept.append(node)
            else:
                found = node
        self.tombstones.update(dict.fromkeys(kept))
        return Victim(found, Action.REMOVE) if found is not None else None

    def touch(self, nodes: Iterable[Node], now: int, *, states: bool) -> None:
        """Refresh the KV of `nodes` and, with `states`, the states they hold."""
        for node in nodes:
            self.kv.touch(node, now)
            if states and node.has_state:
                self.states.touch(node, now)

    def changed(self, node: Node) -> None:
        if not node.has_state:
            self.state_stamp.pop(node, None)
        elif node not in self.state_stamp:
            self.state_stamp[node] = self.now
        self.kv.push(node)
        self.states.push(node)
        if self.LISTS.garbage and alive(node) and node.is_leaf and not node.has_state:
            self.tombstones[node] = None

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.state_stamp.pop(node, None)
        self.high.pop(node, None)

    def restore(self, stamps: dict[Node, float]) -> None:
        for node, t in stamps.items():
            self.stamp[node] = t
            if node.has_state:
                self.state_stamp[node] = t
            self.changed(node)

    def check(self, nodes: Sequence[Node]) -> None:
        kv, states = self.kv.members(), self.states.members()
        stamped = set(self.state_stamp)
        for node in nodes:
            if node.is_leaf and not node.pins:
                assert node in kv, f"leaf {node!r} missing from the KV list"
            if node.has_state and not node.pins:
                assert node in states, f"state of {node!r} missing from the state list"
            assert (node in stamped) == node.has_state, f"state stamp of {node!r} out of step"
            if self.LISTS.garbage and node.is_leaf and not node.has_state and not node.pins:
                assert node in self.tombstones, f"stateless leaf {node!r} not queued"
        assert stamped <= set(nodes), "state stamps kept for nodes no longer in the tree"


class FlopStates:
    """A declared score over a state list (`core.scores.ListScore`: Marconi's, where
    marconi's integrations put it into an engine's walk), evaluated: the lowest first
    (`core.scores.order`), `RECENCY` the candidate's rank in the list's LRU order,
    `EFFICIENCY = (F(depth) - F(top)) / (KV bytes between them + state bytes)`, `top` the
    parent's depth or the nearest state's above. Where the score orders by recency alone
    (Marconi's at alpha 0), the list's own LRU order, exactly."""

    FEATURES = OVER_A_LIST

    def __init__(self, declared: ListScore) -> None:
        check_features(declared.score, self.FEATURES, "an engine's state list")
        self.declared = declared
        self.spec, self.score = declared.spec, declared.score
        self.branches_last = declared.branches_last
        self._f = FlopsAt(declared.spec)

    def parent_depth(self, node: Node) -> int:
        """Where a state's replay starts: its parent (a tree's engine, Marconi's paper), or
        the nearest state above it (vLLM keeps no tree)."""
        if self.declared.from_parent:
            return node.depth - node.edge_len
        return node.depth - replay_length(node)

    def pick(self, states: LazyLRU, protected: Collection[Node], alpha: float) -> Node | None:
        """The state to evict from `states` (outside `protected`) at `alpha`, or None."""
        if self.score.by_recency(alpha):
            entry = states.peek(protected)
            return entry[3] if entry is not None else None
        nodes, eff = self.ranked(states, protected)
        if not nodes:
            return None
        last = np.array([len(n.children) >= 2 for n in nodes]) if self.branches_last else None
        values = {Feature.RECENCY: ranks(len(nodes)), Feature.EFFICIENCY: eff}
        return nodes[int(order(self.score, values, alpha, last)[0])]

    def ranked(self, states: LazyLRU, protected: Collection[Node]
               ) -> tuple[list[Node], np.ndarray]:
        """The states `pick` chooses among (outside `protected`), least recently used
        first, and their efficiencies."""
        seen: dict[Node, Entry] = {}
        for entry in states.heap:
            node = entry[3]
            if node not in seen and node not in protected and states.valid(entry):
                seen[node] = entry
        nodes = [e[3] for e in sorted(seen.values(), key=lambda e: e[:3])]  # LRU first
        kv, state = self.spec.kv_bytes_per_token, self.spec.ssm_bytes
        eff = np.empty(len(nodes))
        for i, n in enumerate(nodes):
            top = self.parent_depth(n)
            eff[i] = (self._f(n.depth) - self._f(top)) / (kv * (n.depth - top) + state)
        return nodes, eff
