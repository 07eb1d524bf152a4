"""The offline reference: its future index, and that it beats every online system."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.spec import PAPER_7B
from marconi.core.tree import RadixTree
from marconi.paper.eviction import LRULeaf
from marconi.sim.future import FutureIndex
from marconi.sim.offline import FutureEviction, JudiciousFutureEviction, ReuseOnlyEviction
from marconi.sim.result import OFFLINE, SimConfig
from marconi.sim.run import run
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions
from tests.helpers import CACHES


def _arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


class TestFutureIndex:
    def test_uses_and_next_use(self) -> None:
        future = FutureIndex([_arr(1, 2, 3, 4), _arr(1, 2, 9), _arr(1, 2, 3, 4, 5)])
        assert future.uses_of(_arr(1, 2).tobytes()) == [0, 1, 2]
        assert future.uses_of(_arr(1, 2, 3).tobytes()) == [0, 2]
        assert future.uses_of(_arr(7).tobytes()) == []
        future.now = 0
        assert future.next_use([0, 1, 2]) == 1
        assert future.next_use([0, 1, 2], exclude=[1]) == 2
        future.now = 2
        assert future.next_use([0, 1, 2]) is None

    def test_reuse_points_are_later_common_prefixes(self) -> None:
        future = FutureIndex([_arr(1, 2, 3, 4), _arr(1, 2, 9), _arr(1, 2, 3, 4, 5)])
        future.now = 0
        # request 1 leaves at depth 2, request 2 extends the whole sequence
        assert future.reuse_points(_arr(1, 2, 3, 4).tobytes()) == [2, 4]
        future.now = 1
        assert future.reuse_points(_arr(1, 2, 9).tobytes()) == [2]


    def test_shared_depth_needs_enough_later_requests(self) -> None:
        future = FutureIndex([_arr(1, 2, 3, 4), _arr(1, 2, 3, 9), _arr(1, 2, 7), _arr(5)])
        key = _arr(1, 2, 3, 4).tobytes()
        future.now = 0  # requests 1 and 2 share (1, 2); only request 1 goes on to 3
        assert future.shared_depth(key) == 2
        assert future.shared_depth(key, at_least=1) == 3
        future.now = 1  # request 2 alone is left
        assert future.shared_depth(key) == 0
        assert future.shared_depth(key, at_least=1) == 2


class TestReuseOnly:
    """Three cached leaves A, B, C with states, touched at 0, 1, 2; later requests reuse A
    (at 3) and C (at 4), never B. The offline eviction knows when: B, then C (the farther
    use). Told only whether, `ReuseOnlyEviction` takes B, then A (the older touch); LRU, which
    knows neither, takes A first."""

    def _victims(self, make: type) -> list[int]:
        a, b, c = _arr(1, 2, 3, 4), _arr(5, 6, 7, 8), _arr(9, 10, 11, 12)
        future = FutureIndex([a, b, c, _arr(1, 2, 3, 4, 13), _arr(9, 10, 11, 12, 14)])
        tree = RadixTree()
        policy = make() if make is LRULeaf else make(PAPER_7B, future)
        leaves = []
        for now, tokens in enumerate((a, b, c)):
            future.now = now
            leaf = tree.insert(tree.root, tokens.tobytes())
            leaf.has_state = True
            policy.on_commit((leaf,), (leaf,), now)
            leaves.append(leaf)
        out = []
        for _ in range(2):
            victim = policy.victim(set(), 3)
            assert victim is not None
            out.append(leaves.index(victim.node))
            tree.remove_leaf(victim.node)
            policy.removed(victim.node)
        return out

    def test_it_knows_whether_not_when(self) -> None:
        assert self._victims(FutureEviction) == [1, 2]
        assert self._victims(ReuseOnlyEviction) == [1, 0]
        assert self._victims(LRULeaf) == [0, 1]

    def test_a_later_touch_keeps_an_entry(self) -> None:
        a, c = _arr(1, 2, 3, 4), _arr(9, 10, 11, 12)
        future = FutureIndex([a, c, _arr(1, 2, 3, 4, 13), _arr(9, 10, 11, 12, 14)])
        tree, policy = RadixTree(), ReuseOnlyEviction(PAPER_7B, future)
        leaves = []
        for now, tokens in enumerate((a, c)):
            leaf = tree.insert(tree.root, tokens.tobytes())
            leaf.has_state = True
            policy.on_commit((leaf,), (leaf,), now)
            leaves.append(leaf)
        policy.on_lookup((leaves[0],), leaves[0], 5)  # A touched again: C is now the older
        victim = policy.victim(set(), 6)
        assert victim is not None and victim.node is leaves[1]


class TestBranches:
    """Leaves A and B; no later input spells either out, but two (at 2 and 3) share part
    of A's edge. Beside judicious admission A is still needed: the first of them finds its
    branch point inside A and checkpoints it, the second hits that state. `offline`'s
    eviction, whose admission reads the future, sees both as dead and takes the first
    slot, A; with `branches` on, B goes."""

    def _victim(self, make: type) -> int:
        a, b = _arr(1, 2, 3, 4, 5, 6), _arr(7, 8, 9, 10, 11, 12)
        future = FutureIndex([a, b, _arr(1, 2, 3, 4, 20), _arr(1, 2, 3, 4, 30)])
        tree, policy = RadixTree(), make(PAPER_7B, future)
        leaves = []
        for now, tokens in enumerate((a, b)):
            future.now = now
            leaf = tree.insert(tree.root, tokens.tobytes())
            leaf.has_state = True
            policy.on_commit((leaf,), (leaf,), now)
            leaves.append(leaf)
        victim = policy.victim(set(), 2)
        assert victim is not None
        return leaves.index(victim.node)

    def test_a_leaf_shared_in_part_stays_beside_judicious_admission(self) -> None:
        assert self._victim(FutureEviction) == 0
        assert self._victim(JudiciousFutureEviction) == 1
        assert self._victim(ReuseOnlyEviction) == 1


TRACES = ["synthetic:system-prompt:sessions=30", "synthetic:multi-turn:sessions=12,turns=5",
          "synthetic:rag:sessions=40", "synthetic:twice:sessions=30"]


@pytest.mark.parametrize("name", TRACES)
def test_offline_beats_every_online_system(name: str) -> None:
    trace = load_trace(name, options=TraceOptions(sps=4.0))
    config = SimConfig(spec=PAPER_7B, capacity="1GB", system=OFFLINE, bounds=False,
                       replay="sequential")  # a reference of the sequential replay
    best = run(trace, config).summary().flops_saved
    for system in CACHES:
        other = run(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=system,
                                     bounds=False, replay="sequential")).summary().flops_saved
        assert best >= other, f"{system} saves {other:.3e} > offline {best:.3e} on {name}"
