"""`offline`: a policy that knows the trace's future (an upper reference), and
`reuse-oracle`, half of what it knows.

Like `marconi-oracle`, both need the whole trace, so the simulator handles them (`run`);
no other face can run them (they are not registered systems). `offline`:

- admission: a state wherever some later request's input leaves the sequence (their
  longest common prefix: exactly where a state would be hit), nowhere else;
- eviction: Belady weighted by bytes and FLOPs (GreedyDual-size in hindsight): among the
  nodes with <= 1 child, evict the largest `(next use - now) x bytes freed / FLOPs it
  saves`; entries no later request uses go first. The next use of a leaf is the first
  later request whose input starts with its prefix; of a one-child node's state, the
  first such request that does not also reach its child's state.

It is a heuristic, not a proof of optimality (weighted caching is NP-hard), but it is
what every figure's `gap_closed` measures against.

`reuse-oracle` ("J + reused"): the paper's judicious admission, as `marconi` runs it, with
`ReuseOnlyEviction`, told only whether a later request reuses an entry, not when.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Sequence

import numpy as np

from marconi.core.columns import Columns
from marconi.core.policy import Action, Admission, Eviction, Victim
from marconi.core.spec import ModelSpec
from marconi.core.tree import TOKEN_BYTES, Match, Node
from marconi.sim.future import FutureIndex
from marconi.sim.replay import simulate
from marconi.sim.result import OFFLINE, REUSE_ORACLE, SimConfig, SimResult
from marconi.systems import System, get_system
from marconi.workload.types import Trace

NEVER = 1e15  # distance of an entry no later request uses


class FutureAdmission(Admission):
    """States only where a later request will hit them."""

    def __init__(self, future: FutureIndex) -> None:
        self.future = future

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        return ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        return ()

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        points = self.future.reuse_points(tokens[: 4 * n_input])
        return tuple(p for p in points if hit < p <= n_input)

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        hit = max((n.depth for n in match.path if n.has_state and n.depth <= n_input), default=0)
        return tuple(p for p in self.future.reuse_points(tokens) if p > hit)


class FutureEviction(Eviction):
    """Evicts the candidate with the largest distance-to-next-use x bytes / FLOPs.

    `branches`: set it when the admission beside it is judicious, which finds a branch
    point only in the tree: a leaf is then also used when two later inputs share part of
    its edge without spelling it out (the first checkpoints its branch point there, the
    second hits it; Mooncake-like traces, whose requests share block prefixes, are mostly
    this), and weighted by what that branch checkpoint saves. `offline` leaves it off: its
    admission reads the future and needs no edge to find a branch point.
    """

    branches = False

    def __init__(self, spec: ModelSpec, future: FutureIndex) -> None:
        super().__init__()
        self.spec, self.future = spec, future
        self._uses: dict[Node, list[int]] = {}  # a node's prefix never changes: cached
        # per candidate: next use (request index), bytes freed / FLOPs saved
        self.columns = Columns({"next": np.float64, "weight": np.float64})

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        return None

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.changed(node)

    def changed(self, node: Node) -> None:
        if node.parent is not None and not node.pins and len(node.children) <= 1:
            row = self.columns.index.get(node)
            if row is None:
                row = self.columns.add(node)
            self.columns["next"][row], self.columns["weight"][row] = self._score(node)
        elif node in self.columns:
            self.columns.drop(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self._uses.pop(node, None)
        if node in self.columns:
            self.columns.drop(node)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        columns, n = self.columns, len(self.columns)
        nxt, weight = columns["next"], columns["weight"]
        for row in np.flatnonzero(nxt[:n] <= self.future.now).tolist():
            nxt[row], weight[row] = self._score(columns.nodes[row])
        priority = self.priority(now)
        for node in protected:
            if node in columns:
                priority[columns.index[node]] = -np.inf
        if not n or not np.isfinite(priority.max()):
            return None
        node = columns.nodes[int(np.argmax(priority))]
        return Victim(node, Action.REMOVE if node.is_leaf else Action.MERGE)

    def priority(self, now: int) -> np.ndarray:
        """Each candidate's claim to leave (the largest goes), its columns fresh."""
        n = len(self.columns)
        return (self.columns["next"][:n] - self.future.now) * self.columns["weight"][:n]

    def _score(self, node: Node) -> tuple[float, float]:
        """(next use, bytes freed per FLOP saved) of evicting `node` now."""
        nxt, weight = self._spelled_score(node)
        if nxt < NEVER or not node.is_leaf or not self.branches:
            return nxt, weight
        # No later input spells the leaf out, but two may share part of its edge: the
        # first would find its branch point in this edge and checkpoint it, the second hit
        # that state. The leaf is then reused, for what that branch checkpoint saves.
        start = node.depth - node.edge_len
        key = b"".join(n.key for n in _path(node))
        shared = self.future.shared_depth(key)
        if shared <= start:
            return nxt, weight
        saved = self.spec.flops(shared) - self.spec.flops(_state_below(node))
        freed = node.edge_len * self.spec.kv_bytes_per_token + (
            self.spec.ssm_bytes if node.has_state else 0)
        return self._branch_use(key[: shared * TOKEN_BYTES]), freed / max(saved, 1.0)

    def _branch_use(self, shared: bytes) -> float:
        """When a leaf whose edge later inputs share (`shared`, their common prefix) is
        next needed: when the first of them arrives and finds its branch point there."""
        nxt = self.future.next_use(self.future.uses_of(shared))
        return float(nxt) if nxt is not None else NEVER

    def _spelled_score(self, node: Node) -> tuple[float, float]:
        """`_score` counting only later inputs that spell `node`'s prefix out."""
        leaf = node.is_leaf
        freed = (node.edge_len * self.spec.kv_bytes_per_token if leaf else 0) + (
            self.spec.ssm_bytes if node.has_state else 0)
        if not node.has_state:
            return (NEVER if leaf else self.future.now + 1.0), float(freed)
        exclude: list[int] = []
        if not leaf:
            (child,) = node.children.values()
            exclude = self._uses_of(child) if child.has_state else []
        nxt = self.future.next_use(self._uses_of(node), exclude)
        saved = self.spec.flops(node.depth) - self.spec.flops(_state_below(node))
        return (float(nxt) if nxt is not None else NEVER), freed / max(saved, 1.0)

    def _uses_of(self, node: Node) -> list[int]:
        if node not in self._uses:
            key = b"".join(n.key for n in _path(node))
            self._uses[node] = self.future.uses_of(key)
        return self._uses[node]


class ReuseOnlyEviction(FutureEviction):
    """Half of what `FutureEviction` knows, to measure what the other half is worth: whether
    a candidate is ever used again, not when (the eviction of `reuse-oracle`, and of
    `experiments/bench_offline_parts.py`'s `J + reused`).

    Entries no later request uses go first (the most bytes per FLOP saved first), as in
    `FutureEviction`; among the others, the distance to the next use, which it does not
    know, is replaced by the time since the last touch (a lookup or commit through the
    node): the largest `(now - last touch) x bytes freed / FLOPs saved` goes.

    Its admission is judicious, so `branches` is on: a leaf that two later inputs share in
    part is reused too.
    """

    branches = True

    def __init__(self, spec: ModelSpec, future: FutureIndex) -> None:
        super().__init__(spec, future)
        self.columns = Columns({"next": np.float64, "weight": np.float64, "touched": np.float64})

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        self._touch(path, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = now
        super().on_commit(path, new, now)
        self._touch(path, now)

    def _touch(self, nodes: Iterable[Node], now: int) -> None:
        columns = self.columns
        for node in nodes:
            self.stamp[node] = now
            row = columns.index.get(node)
            if row is not None:
                columns["touched"][row] = now

    def changed(self, node: Node) -> None:
        super().changed(node)
        row = self.columns.index.get(node)
        if row is not None:
            self.columns["touched"][row] = self.stamp.get(node, 0)

    def _branch_use(self, shared: bytes) -> float:
        return self.future.now + 1.0  # whether, not when: looked at again next request

    def priority(self, now: int) -> np.ndarray:
        n = len(self.columns)
        nxt, weight = self.columns["next"][:n], self.columns["weight"][:n]
        age = (now - self.columns["touched"][:n] + 1.0) * weight
        # weight 0: a stateless interior node, which frees nothing (last, as in the parent)
        return np.where(nxt >= NEVER, NEVER * (1.0 + weight), np.where(weight > 0, age, -1.0))


class JudiciousFutureEviction(FutureEviction):
    """`FutureEviction` beside judicious admission (`bench_offline_parts.py`'s
    `J + F evict`): `branches` on."""

    branches = True


def _path(node: Node) -> list[Node]:
    out: list[Node] = []
    cur: Node | None = node
    while cur is not None and cur.parent is not None:
        out.append(cur)
        cur = cur.parent
    return out[::-1]


def _state_below(node: Node) -> int:
    """Depth of the deepest ancestor holding a state (0: none)."""
    cur = node.parent
    while cur is not None and cur.parent is not None and not cur.has_state:
        cur = cur.parent
    return cur.depth if cur is not None else 0


def offline_system(future: FutureIndex) -> System:
    return System(name=OFFLINE,
                  policies=lambda spec, alpha: (FutureAdmission(future),
                                                FutureEviction(spec, future)),
                  description="knows the future: upper reference")


def reuse_oracle_system(future: FutureIndex) -> System:
    def policies(spec: ModelSpec, alpha: float) -> tuple[Admission, Eviction]:
        admission, _ = get_system("marconi").policies(spec, 0.0)  # the paper's judicious
        return admission, ReuseOnlyEviction(spec, future)

    return System(name=REUSE_ORACLE, policies=policies,
                  description="judicious admission, eviction told only which entries "
                              "a later request reuses")


def offline(trace: Trace, config: SimConfig, *, progress: bool = False) -> SimResult:
    """Replay `trace` under the offline reference (one pass to index the future)."""
    return _with_future(trace, config, OFFLINE, offline_system, progress)


def reuse_oracle(trace: Trace, config: SimConfig, *, progress: bool = False) -> SimResult:
    """Replay `trace` under `reuse-oracle` (one pass to index the future)."""
    return _with_future(trace, config, REUSE_ORACLE, reuse_oracle_system, progress)


def _with_future(trace: Trace, config: SimConfig, name: str,
                 make: Callable[[FutureIndex], System], progress: bool) -> SimResult:
    future = FutureIndex([r.input_tokens for r in trace])

    def at(i: int) -> None:
        future.now = i

    config = dataclasses.replace(config, system=name, alpha=None)
    return simulate(trace, config, progress=progress, system=make(future), before=at)
