from __future__ import annotations

import numpy as np
import pytest

from marconi.core.tree import RadixTree
from marconi.paper.admission import Block, Judicious, branch_point
from marconi.paper.eviction import FlopAware, LRULeaf, Recency
from marconi.systems import SYSTEMS, System, get_system, register
from tests.helpers import SMALL


def _key(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


def _tree(*seqs: list[int]) -> RadixTree:
    tree = RadixTree()
    for seq in seqs:
        m = tree.match(_key(seq))
        parent = m.node or tree.root
        if m.partial is not None and m.offset:
            parent = tree.split(m.partial, m.offset)
        if m.length < len(seq):
            tree.insert(parent, _key(seq)[4 * m.length :])
    return tree


class TestRegistry:
    def test_paper_systems_registered(self) -> None:
        assert {"vanilla", "vllm+", "sglang+", "marconi"} <= set(SYSTEMS)

    @pytest.mark.parametrize("name", sorted(SYSTEMS))
    def test_every_system_builds_fresh_policies(self, name: str) -> None:
        system = get_system(name)
        first, second = system.policies(SMALL, 0.5), system.policies(SMALL, 0.5)
        assert first[0] is not second[0] and first[1] is not second[1]

    def test_duplicate_name_refused(self) -> None:
        with pytest.raises(ValueError, match="already registered"):
            register(System(name="marconi",
                            policies=lambda spec, alpha: (Judicious(), LRULeaf())))

    def test_unknown_name_lists_known(self) -> None:
        with pytest.raises(ValueError, match=r"known systems: .*marconi"):
            get_system("lfu")


class TestAdmission:
    def test_branch_mid_edge(self) -> None:
        m = _tree([1, 2, 3, 4]).match(_key([1, 2, 9]))
        assert branch_point(m, 3) == 2
        assert Judicious().checkpoints(m, 3, hit=0) == (2,)
        assert Judicious().positions(m, 3, 3) == (2, 3)

    def test_no_branch_when_input_is_a_prefix(self) -> None:
        m = _tree([1, 2, 3, 4]).match(_key([1, 2]))
        assert branch_point(m, 2) is None
        assert Judicious().positions(m, 2, 2) == (2,)

    def test_block_positions_keep_the_partial_tail(self) -> None:
        m = RadixTree().match(_key(list(range(70))))
        assert Block(32).positions(m, 70, 70) == (32, 64, 70)
        assert Block(32).checkpoints(m, 70, hit=32) == (64,)

    def test_block_size_validated(self) -> None:
        with pytest.raises(ValueError, match="block size"):
            Block(0)


class TestFlopAware:
    def _policy(self, recency: Recency = Recency.TIME) -> tuple[FlopAware, RadixTree]:
        tree = _tree([1] * 10, [2] * 100, [3] * 10)
        policy = FlopAware(SMALL, alpha=1.0, recency=recency)
        for t, node in enumerate(tree.nodes()):
            node.has_state = True
            policy.stamp[node] = t + 1
            policy.changed(node)
        return policy, tree

    def test_scores_are_minmax_normalized(self) -> None:
        policy, _ = self._policy()
        scores = policy.scores(now=10)
        assert scores.min() >= 0 and scores.max() <= 2

    def test_all_equal_normalize_to_one(self) -> None:
        policy = FlopAware(SMALL, alpha=0.5)
        tree = _tree([1] * 10)
        (node,) = tree.nodes()
        policy.changed(node)
        assert policy.scores(now=1).tolist() == [1.5]

    def test_efficiency_counts_state_and_kv(self) -> None:
        policy, tree = self._policy()
        long = next(n for n in tree.nodes() if n.depth == 100)
        held = 100 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        assert policy.efficiency(long) == SMALL.flops(100) / held

    def test_inverse_age_variant_selectable(self) -> None:
        a, _ = self._policy(Recency.TIME)
        b, _ = self._policy(Recency.INVERSE_AGE)
        assert not np.allclose(a.scores(now=4), b.scores(now=4))

    @pytest.mark.parametrize("alpha", [-0.1, float("nan"), float("inf")])
    def test_bad_alpha(self, alpha: float) -> None:
        with pytest.raises(ValueError, match="alpha"):
            FlopAware(SMALL, alpha=alpha)


class TestLRU:
    def test_deepest_first_on_ties(self) -> None:
        tree = _tree([1, 2], [5] * 8)
        policy = LRULeaf(deepest_first=True)
        policy.on_commit(tree.nodes(), [], now=3)
        victim = policy.victim((), now=4)
        assert victim is not None and victim.node.depth == 8

    def test_protected_leaf_skipped_and_kept(self) -> None:
        tree = _tree([1, 2], [5] * 8)
        policy = LRULeaf()
        old, new = sorted(tree.nodes(), key=lambda n: n.depth)
        policy.on_commit([old], [], now=1)
        policy.on_commit([new], [], now=2)
        victim = policy.victim({old}, now=3)
        assert victim is not None and victim.node is new
        assert policy.victim((), now=3).node is old  # type: ignore[union-attr]
