"""What an infinite cache could reuse: every prefix ever seen, token by token.

`SeenTree` holds every committed sequence in a radix tree. For a new input it reports
`seen` (the longest prefix seen before) and `from_inputs` (how much of that prefix was
seen inside some earlier request's *input*), which splits reuse into the paper's
taxonomy: purely input, input and output, neither.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import numpy as np

from marconi.core import compiled
from marconi.core.policy import Eviction, Victim, overrides
from marconi.core.tree import TOKEN_BYTES, Node, RadixTree

UNBOUNDED = 2**62  # bytes: the same-system bound's capacity, never reached
# Distinct tokens the bounds may hold (their two trees take ~10 bytes a token, ~1.3 GB
# here): past it a replay drops its bounds and says so, rather than grow with the trace.
BOUND_TOKENS = 2**27


class KeepAll(Eviction):
    """The eviction of a cache that never runs out of room (the same-system bound): it is
    never asked for a victim, so it keeps no books (a policy's stamps and heaps would hold
    an entry for every node of the trace)."""

    compiled_as = "keep"  # the compiled core runs it (marconi.core.compiled)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        return None

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        return None

    def changed(self, node: Node) -> None:
        return None

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        raise AssertionError(f"an unbounded cache ({UNBOUNDED} bytes) never evicts")


def keep_all(eviction: Eviction) -> Eviction:
    """The eviction of the same-system bound (`System.cache(..., evict_with=keep_all)`):
    `KeepAll`, unless the policy evicts garbage whatever the budget (which the bound must
    do too): the hit of a cache that never evicts depends on its admission only."""
    return eviction if overrides(eviction, "garbage") else KeepAll()


@dataclass(frozen=True, slots=True)
class Seen:
    seen: int  # longest prefix of the input seen before
    from_inputs: int  # of it, the part seen within an earlier input (<= seen)


class SeenTree:
    """The Python tree of every prefix seen; `CompiledSeenTree` is its twin in the
    compiled core (`seen_tree` picks)."""

    def __init__(self) -> None:
        self.tree = RadixTree()
        self._input_depth: dict[Node, int] = {}  # max input length of sequences through a node
        self.tokens = 0  # distinct tokens held: every prefix committed, counted once

    def lookup(self, tokens: np.ndarray) -> Seen:
        match = self.tree.match(tokens.tobytes())
        last = match.partial or match.node
        if last is None:
            return Seen(0, 0)
        return Seen(match.length, min(match.length, self._input_depth[last]))

    def commit(self, tokens: np.ndarray, n_input: int) -> None:
        key = tokens.tobytes()
        match = self.tree.match(key)
        parent = match.node or self.tree.root
        if match.partial is not None and match.length < len(tokens):
            parent = self.tree.split(match.partial, match.offset)
            self._input_depth[parent] = self._input_depth[match.partial]
        path = [*match.path, *([parent] if parent is not match.node else [])]
        if match.partial is not None and match.length == len(tokens):
            path.append(match.partial)
        if match.length < len(tokens):
            path.append(self.tree.insert(parent, key[match.length * TOKEN_BYTES :]))
            self.tokens += len(tokens) - match.length
        for node in path:
            self._input_depth[node] = max(self._input_depth.get(node, 0), n_input)


class CompiledSeenTree:
    """`SeenTree` in the compiled core (`core/native/serving.hpp`): the same answers
    (tests/test_serving_native.py draws sequences for both)."""

    def __init__(self) -> None:
        self._tree = compiled.native_seen_tree()

    @property
    def tokens(self) -> int:
        return int(self._tree.tokens)

    def lookup(self, tokens: np.ndarray) -> Seen:
        seen, from_inputs = self._tree.lookup(np.ascontiguousarray(tokens, dtype=np.int32))
        return Seen(int(seen), int(from_inputs))

    def commit(self, tokens: np.ndarray, n_input: int) -> None:
        self._tree.commit(np.ascontiguousarray(tokens, dtype=np.int32), int(n_input))


def seen_tree(bound: object) -> SeenTree | CompiledSeenTree:
    """The tree of every prefix for a run whose same-system bound is `bound`: in the
    compiled core where the bound is (the run is compiled), else the Python one."""
    if isinstance(bound, compiled.CompiledCache):
        return CompiledSeenTree()
    return SeenTree()
