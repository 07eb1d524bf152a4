from __future__ import annotations

import numpy as np
import pytest

from marconi.core.tree import RadixTree
from marconi.paper.admission import Block, Judicious, branch_point
from marconi.paper.eviction import FlopAware, LRULeaf, Recency
from marconi.systems import System, get_system, register
from tests.helpers import CACHES, SMALL


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
        assert {"vanilla", "vllm+", "sglang+", "marconi"} <= set(CACHES)

    @pytest.mark.parametrize("name", sorted(CACHES))
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
            get_system("mru")


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

    def _three_leaves(self, recency: Recency) -> tuple[FlopAware, list]:
        """Leaves of 10, 100 and 10 tokens under the root, touched at 1, 2 and 3."""
        tree = _tree([1] * 10, [2] * 100, [3] * 10)
        policy = FlopAware(SMALL, alpha=1.0, recency=recency)
        nodes = sorted(tree.nodes(), key=lambda n: n.tokens()[0])
        for t, node in enumerate(nodes, start=1):
            node.has_state = True
            policy.stamp[node] = t
            policy.changed(node)
        return policy, nodes

    def test_scores_are_minmax_normalized(self) -> None:
        """recency (t - 1) / 2 plus efficiency, 0 for the short leaves, 1 for the long one."""
        policy, nodes = self._three_leaves(Recency.TIME)
        scores = dict(zip(policy.columns.nodes, policy.scores(now=10).tolist(), strict=True))
        assert [scores[n] for n in nodes] == [0.0, 1.5, 1.0]
        victim = policy.victim((), now=10)
        assert victim is not None and victim.node is nodes[0]
        assert policy.victim({nodes[0]}, now=10).node is nodes[2]  # type: ignore[union-attr]

    def test_inverse_age_normalizes_one_over_age(self) -> None:
        """At now=4 the ages 4, 3, 2 give 1/4, 1/3, 1/2: normalized 0, 1/3, 1."""
        policy, nodes = self._three_leaves(Recency.INVERSE_AGE)
        scores = dict(zip(policy.columns.nodes, policy.scores(now=4).tolist(), strict=True))
        assert [scores[n] for n in nodes] == pytest.approx([0.0, 1 / 3 + 1.0, 1.0])

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

    def test_efficiency_is_relative_to_the_parent(self) -> None:
        """A child from 10 to 30 tokens saves F(30) - F(10) over 20 tokens of KV (and a
        state when it holds one)."""
        tree = _tree([1] * 10, [1] * 10 + [2] * 20, [1] * 10 + [3] * 5)
        child = next(n for n in tree.nodes() if n.depth == 30)
        policy = FlopAware(SMALL)
        saved = SMALL.flops(30) - SMALL.flops(10)
        assert policy.efficiency(child) == saved / (20 * SMALL.kv_bytes_per_token)
        child.has_state = True
        held = 20 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        assert policy.efficiency(child) == saved / held

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

    def test_past_a_protected_head_a_stale_entry_is_no_candidate(self) -> None:
        """b touched again at 4 keeps its entry at 2 in the heap: with the head protected,
        the search past it takes c (3), not b at its stale stamp."""
        tree = _tree([1, 2], [5] * 8, [7, 7, 7])
        policy = LRULeaf()
        a, c, b = sorted(tree.nodes(), key=lambda n: n.depth)
        for now, node in ((1, a), (2, b), (3, c), (4, b)):
            policy.on_commit([node], [], now=now)
        victim = policy.victim({a}, now=5)
        assert victim is not None and victim.node is c

    def test_stale_tops_are_dropped_and_the_victim_stays(self) -> None:
        """The victim is read at the top of the heap in place: entries of evicted or
        re-touched nodes above it are dropped, the victim's own entry kept."""
        tree = _tree([1, 2], [5] * 8, [7, 7, 7])
        policy = LRULeaf()
        a, b, c = sorted(tree.nodes(), key=lambda n: n.depth)
        policy.on_commit([a, b, c], [], now=1)
        policy.on_commit([a], [], now=2)  # a's entry at 1 is stale now
        tree.remove_leaf(c)  # c's entry is of a node gone
        first = policy.victim((), now=3)
        assert first is not None and first.node is b
        assert len(policy._heap) == 2  # b's entry and a's fresh one
        assert policy.victim((), now=3).node is b  # type: ignore[union-attr]


class TestHooks:
    def test_overrides_names_the_hooks_a_policy_replaces(self) -> None:
        from marconi.core.policy import overrides
        from marconi.peers.mamba_radix import MambaRadixLRU

        assert not overrides(LRULeaf(), "pressure") and not overrides(LRULeaf(), "garbage")
        assert overrides(LRULeaf(), "victim")
        assert overrides(MambaRadixLRU(), "pressure") and overrides(MambaRadixLRU(), "garbage")
