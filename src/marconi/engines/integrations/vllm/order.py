"""How the vLLM plugin orders the Mamba states that leave: `StateOrder`, Marconi's score over
a Mamba group's free cached states (`recency + alpha x efficiency`, min-max normalized over
the candidates; a state no hit can use first) and the books it reads of each state, and
the score in Python for a few candidates (`flop_scores`, `first_lowest`: numpy's, bit for
bit). Plain Python and numpy: the pool's hooks keep the books (`books.BookedPool`), its
choice asks `pick` (`pool.MarconiBlockPool`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from marconi.core.priority import Feature, Key, Priority, Score, key_function, key_value
from marconi.core.scores import (
    OVER_A_LIST,
    FlopsAt,
    check_features,
    evaluate,
    in_python,
    order,
    ranks,
)
from marconi.core.scores import first_lowest as lowest_in_python
from marconi.core.spec import ModelSpec


class StateOrder:
    """Marconi's score over the free cached states of a Mamba group, and what it needs to
    know of each state (its efficiency, whether a hit can still use it), kept up to date by
    the pool's hooks so that a choice reads them for the candidates that one walk of vLLM's
    free queue finds (`MarconiBlockPool._free_states`); `alpha` may change at any time
    (the tuner sets it; a float assignment is atomic). A state is a block hash (group id
    left out) with one block per Mamba group. `first` is the same choice made the plain way, over a
    list: the reference that `check` compares every choice with."""

    FEATURES = OVER_A_LIST

    counts_hits = False  # whether `touched` keeps books (`DeclaredStates` reading HITS)

    def __init__(self, spec: ModelSpec, score: Score, alpha: float = 0.0,
                 orphans_first: bool = True) -> None:
        self.score = score  # the declared score (Marconi's), `RECENCY` the free queue rank
        check_features(self.score, self.FEATURES, "marconi's order in vLLM")
        self.alpha = float(alpha)
        self._books(spec, orphans_first)

    def _books(self, spec: ModelSpec, orphans_first: bool) -> None:
        self.spec = spec
        self.orphans_first = orphans_first  # False: orphan KV left in vLLM's order
        self.check = False  # True: every choice also made by `first`, and compared
        # block id -> (depth, state above, efficiency): all three fixed when it is cached
        self.above: dict[int, tuple[int, int, float]] = {}
        self.eff_of = np.zeros(0)  # block id -> its state's efficiency (set by `note`)
        self.state_of: dict[int, bytes] = {}  # block id -> its state
        self.blocks_of: dict[bytes, set[int]] = {}  # state -> its cached blocks
        # state -> the hash keys a hit on it needs: the deepest attention block at or
        # before its depth (one per attention group) and its block in every Mamba group
        self.keys_of: dict[bytes, tuple[Any, ...]] = {}
        self.needed_by: dict[Any, set[bytes]] = {}  # hash key -> states needing it
        self.dead: set[bytes] = set()  # states one of whose keys is not cached
        self._f = FlopsAt(spec)
        self._kv, self._ssm = spec.kv_bytes_per_token, spec.ssm_bytes

    def size(self, num_blocks: int) -> None:
        self.eff_of = np.zeros(num_blocks)

    def by_recency(self) -> bool:
        """Whether the order is the free queue's own (recency's alone, as now weighed)."""
        return self.score.by_recency(self.alpha)

    def clear(self) -> None:
        """Every book emptied (vLLM's prefix cache reset)."""
        for book in (self.above, self.state_of, self.blocks_of, self.keys_of,
                     self.needed_by, self.dead):
            book.clear()

    def touched(self, blocks: Any) -> None:
        """`blocks` hit by a request (vLLM's `touch`): nothing to keep here."""

    def above_of(self, depth: int, top: int) -> tuple[int, int, float]:
        """What `note` keeps of a state cached after `depth` tokens whose nearest cached
        state above was after `top`: both, and its efficiency."""
        return depth, top, self._efficiency(depth, top)

    def note(self, block_id: int, state: bytes, above: tuple[int, int, float]) -> None:
        """Block `block_id` of `state` (`above`: `above_of` its depth and top; a state's
        blocks in the other groups share the tuple)."""
        if self.state_of.get(block_id) not in (None, state):
            self.forget(block_id)
        self.above[block_id] = above
        self.eff_of[block_id] = above[2]
        self.state_of[block_id] = state
        blocks = self.blocks_of.get(state)
        if blocks is None:
            self.blocks_of[state] = {block_id}
        else:
            blocks.add(block_id)

    def depend(self, state: bytes, keys: tuple[Any, ...], cached: Any) -> None:
        """`state` needs `keys` cached for a hit (`cached(key)`: is it now)."""
        self.keys_of[state] = keys
        for key in keys:
            self.needed_by.setdefault(key, set()).add(state)
        if not all(map(cached, keys)):
            self.dead.add(state)

    def forget(self, block_id: int) -> None:
        """A state block's hash is gone; its state's books go with its last block."""
        self.above.pop(block_id, None)
        state = self.state_of.pop(block_id, None)
        if state is None:
            return
        blocks = self.blocks_of.get(state, set())
        blocks.discard(block_id)
        if blocks:
            return
        self.blocks_of.pop(state, None)
        for key in self.keys_of.pop(state, ()):
            users = self.needed_by.get(key)
            if users is not None:
                users.discard(state)
                if not users:
                    del self.needed_by[key]
        self.dead.discard(state)

    def removed(self, key: Any) -> None:
        """`key` is cached no more: the states needing it can serve no hit."""
        users = self.needed_by.get(key)
        if users:
            self.dead.update(users)

    def inserted(self, key: Any, cached: Any) -> None:
        """`key` is cached again: a state needing it lives if all its keys are (looked up
        last first: a state being cached comes up group by group, so that its last Mamba
        group's key is the one still missing but at its last group)."""
        for state in self.needed_by.get(key, ()):
            if state in self.dead and all(map(cached, reversed(self.keys_of[state]))):
                self.dead.discard(state)

    def pick(self, found: dict[int, Any], skip: set[int]) -> Any:
        """The state block to evict among the free ones `found` (free queue order) less
        `skip`: the first whose KV or other blocks are gone, else the first in Marconi's
        order (min-max normalized over exactly these candidates)."""
        ids = [i for i in found if i not in skip] if skip else list(found)
        if len(ids) < 2 or self.by_recency():
            return found[ids[0]]
        dead = self.dead
        if dead:  # (a block's state is `state_of`'s, the same books as `blocks_of`)
            state_of = self.state_of
            for i in ids:
                if state_of.get(i) in dead:
                    return found[i]
        if len(ids) <= FEW:  # numpy's calls cost more than the score in Python
            item = self.eff_of.item
            return found[ids[first_lowest([item(i) for i in ids], self.alpha, self.score)]]
        at = np.array(ids, dtype=np.int64)
        values = {Feature.RECENCY: ranks(len(ids)), Feature.EFFICIENCY: self.eff_of[at]}
        return found[ids[int(np.argmin(evaluate(self.score, values, self.alpha)))]]

    def efficiency(self, block: Any) -> float:
        depth = int(block.block_hash_num_tokens)
        known = self.above.get(block.block_id)
        if known is not None and known[0] == depth:
            return known[2]
        return self._efficiency(depth, 0)

    def _efficiency(self, depth: int, top: int) -> float:
        held = self._kv * (depth - top) + self._ssm
        return (self._f(depth) - self._f(top)) / held

    def first(self, candidates: list[Any], cached: Any) -> int:
        """The index, in `candidates` (free queue order), of the state to evict: the
        first whose KV or other blocks are gone (`cached(key)` false for a key of its
        state's `keys_of`: no hit can use it, and a tree would have dropped it with its
        KV), else the first in Marconi's order."""
        if len(candidates) < 2 or self.by_recency():
            return 0
        for i, block in enumerate(candidates):
            state = self.state_of.get(block.block_id)
            if not all(cached(key) for key in self.keys_of.get(state, ())):  # type: ignore
                return i
        eff = np.array([self.efficiency(b) for b in candidates])
        values = {Feature.RECENCY: ranks(len(eff)), Feature.EFFICIENCY: eff}
        return int(order(self.score, values, self.alpha)[0])


class DeclaredStates(StateOrder):
    """A declared `Priority` (`core.priority`) over a Mamba group's free cached states, the
    books `StateOrder`'s (its score unused): lowest keys first, then the state cached
    first (the declaration's last tie). A state's features: `RECENCY` its rank in vLLM's
    free queue (least recently used first), `HITS` 1 (its caching) plus the requests that
    hit it (vLLM's `touch`), `CREATED` the order it was cached in, `DEPTH` its tokens,
    `STATE` 1. Cached KV stays in vLLM's order (no orphans first: Marconi's rule), and no
    state goes first for having lost its KV; untuned (`alpha` 0 for the report)."""

    def __init__(self, spec: ModelSpec, priority: Priority) -> None:
        self.priority, self.alpha = priority, 0.0
        self._books(spec, orphans_first=False)
        self.counts_hits = Feature.HITS in priority.features
        self.hits: dict[int, int] = {}  # block id -> the requests that hit it
        self.created: dict[bytes, int] = {}  # state -> the order it was cached in
        self._clock = 0
        self._recency = self.priority.features == {Feature.RECENCY} and all(
            t.weight > 0 for k in priority.keys for t in k.terms)
        # A last key of recency alone, weighed up, is the free queue's own order: the first
        # candidate lowest on the keys before it is the lowest on all of them (ranks are
        # unique, so no tie reaches the creation order), and only those keys are computed.
        last = priority.keys[-1].terms
        self._queue_last = (len(last) == 1 and last[0].feature is Feature.RECENCY
                            and last[0].weight > 0 and last[0].at_least is None)
        self._before = _key_function(priority.keys[:-1], self) if self._queue_last else None

    def by_recency(self) -> bool:
        return self._recency

    def note(self, block_id: int, state: bytes, above: tuple[int, int, float]) -> None:
        if self.state_of.get(block_id) != state:
            self.hits.pop(block_id, None)
        super().note(block_id, state, above)
        if state not in self.created:
            self._clock += 1
            self.created[state] = self._clock

    def forget(self, block_id: int) -> None:
        state = self.state_of.get(block_id)
        super().forget(block_id)
        self.hits.pop(block_id, None)
        if state is not None and state not in self.blocks_of:
            self.created.pop(state, None)

    def clear(self) -> None:
        super().clear()
        self.hits.clear()
        self.created.clear()

    def touched(self, blocks: Any) -> None:
        hits, state_of = self.hits, self.state_of
        for block in blocks:
            if block.block_id in state_of:
                hits[block.block_id] = hits.get(block.block_id, 0) + 1

    def key_values(self, block_id: int, rank: int) -> dict[Feature, float]:
        """The features of state block `block_id` at free queue rank `rank`."""
        state = self.state_of.get(block_id)
        known = self.above.get(block_id)
        return {Feature.RECENCY: float(rank), Feature.HITS: 1.0 + self.hits.get(block_id, 0),
                Feature.CREATED: float(self.created.get(state, 0)) if state else 0.0,
                Feature.STATE: 1.0, Feature.DEPTH: float(known[0]) if known else 0.0}

    def key(self, block_id: int, rank: int) -> tuple[float, ...]:
        """The declaration's keys of state block `block_id` at free queue rank `rank`,
        then its state's caching order."""
        values = self.key_values(block_id, rank)
        return (*(key_value(k, values) for k in self.priority.keys), values[Feature.CREATED])

    def pick(self, found: dict[int, Any], skip: set[int]) -> Any:
        ids = [i for i in found if i not in skip] if skip else list(found)
        if len(ids) < 2 or self._recency:
            return found[ids[0]]
        return found[ids[self._lowest(ids)]]

    def first(self, candidates: list[Any], cached: Any) -> int:
        return self._lowest([b.block_id for b in candidates]) if candidates else 0

    def _lowest(self, ids: list[int]) -> int:
        """The index in `ids` (free queue order) of the state block lowest on the keys."""
        before = self._before
        if before is not None:  # (`min` keeps the first of equals: the queue's order)
            return min(range(len(ids)), key=lambda rank: before(ids[rank], rank))
        return min(range(len(ids)), key=lambda rank: self.key(ids[rank], rank))


def _key_function(keys: tuple[Key, ...], order: DeclaredStates) -> Callable[[int, int], Any]:
    """`keys` over a state block of `order`'s books as one function of (block id, free
    queue rank) (`core.priority.key_function`: a float for one key, else a tuple). On
    vLLM's scheduling path: the dict of every feature that `key` builds per candidate
    costs more than the comparison."""
    hits, created, state_of, above = order.hits, order.created, order.state_of, order.above

    def depth(block: int) -> float:
        known = above.get(block)
        return float(known[0]) if known else 0.0

    def born(block: int) -> float:
        state = state_of.get(block)
        return float(created.get(state, 0)) if state else 0.0

    read: dict[Feature, Callable[[int, int], float]] = {
        Feature.RECENCY: lambda block, rank: float(rank),
        Feature.HITS: lambda block, rank: 1.0 + hits.get(block, 0),
        Feature.CREATED: lambda block, rank: born(block),
        Feature.DEPTH: lambda block, rank: depth(block),
        Feature.STATE: lambda block, rank: 1.0}
    return key_function(keys, read, one_as_float=True)


FEW = 48  # candidates up to which `StateOrder.pick` scores them in Python


def flop_scores(effs: list[float], alpha: float, score: Score) -> list[float]:
    """The declared `score` of candidates in free queue order with
    efficiencies `effs`, in plain Python (`core.scores.in_python`: numpy's, bit for bit),
    without numpy's cost per call, some ten of them, on a few candidates."""
    return in_python(score, {Feature.RECENCY: _ranks(len(effs)), Feature.EFFICIENCY: effs},
                     alpha)


def first_lowest(effs: list[float], alpha: float, score: Score) -> int:
    """`flop_scores`' first lowest: numpy's `argmin` of the same scores."""
    return lowest_in_python(score, {Feature.RECENCY: _ranks(len(effs)),
                                    Feature.EFFICIENCY: effs}, alpha)


_RANKS = [float(k) for k in range(FEW + 1)]  # `RECENCY` of up to `FEW` candidates


def _ranks(n: int) -> list[float]:
    """`RECENCY` of `n` candidates in free queue order: their ranks, as floats."""
    return _RANKS[:n] if n <= FEW else [float(k) for k in range(n)]
