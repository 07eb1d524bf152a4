"""Exact values the mutation pass (benchmarks/bench_mutation.py) found no test asserting:
unpin really unpins, evict(0) frees nothing and evict returns what it freed, a merged-away
node is detached, required_states reads the namespace it is given, a node's repr; the
tree's contracts (salts, ids, namespaces, match, split, insert, remove_leaf's cleanup,
check's messages), Block's and Judicious's range ends, every stats counter, alpha
handling, FlopAware.fresh/restore/removed, floor, a grown partial block, peek."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.cache import CommitResult, PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.layout import Layout
from marconi.core.policy import Action, Pressure, Victim, check_alpha
from marconi.core.state_store import Freed
from marconi.core.stats import CacheStats
from marconi.core.tree import Match, RadixTree, check_salt
from marconi.paper.admission import Block, Judicious, branch_point
from marconi.paper.eviction import FlopAware, LRULeaf, Recency
from marconi.systems import make_cache
from tests.helpers import SMALL, ListStore

ENTRY = 20 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes  # one 20-token sequence, one state


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _key(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


class TestPins:
    def test_unpin_undoes_pin_and_the_entry_can_leave(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20)
        node = cache.lookup(_seq(0, 20)).node
        cache.pin(node)
        cache.pin(node)
        cache.unpin(node)
        assert node is not None and node.pins == 1 and cache.evict(ENTRY) == 0
        cache.unpin(node)
        assert node.pins == 0 and cache.pinned == set()
        assert cache.evict(ENTRY) == ENTRY and cache.bytes == 0
        check_integrity(cache)


class TestEvict:
    def test_evict_zero_frees_nothing_and_evict_returns_what_it_freed(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        for start in (0, 1000, 2000):
            cache.commit(_seq(start, 20), 20)
        assert cache.evict(0) == 0 and cache.bytes == 3 * ENTRY
        assert cache.evict(1) == ENTRY and cache.bytes == 2 * ENTRY  # one whole entry
        assert cache.evict(ENTRY + 1) == 2 * ENTRY and cache.stats.evictions == 3


class TestRequiredStates:
    def test_each_namespace_has_its_own_states(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20, salt="a")
        assert cache.required_states(_seq(0, 20), 20, salt="a") == ()
        assert cache.required_states(_seq(0, 20), 20) == (20,)

    def test_errors_name_the_call(self) -> None:
        with pytest.raises(ValueError, match="required_states: empty token list"):
            make_cache(SMALL, "1TB", "sglang+").required_states([], 0)


class TestTree:
    def test_a_merged_node_is_detached(self) -> None:
        tree = RadixTree()
        top = tree.insert(tree.root, _key([1, 2, 3]))
        child = tree.insert(top, _key([4, 5]))
        assert tree.merge_into_child(top) is child
        assert top.parent is None and top.children == {}

    def test_repr_names_id_depth_edge_and_state(self) -> None:
        tree = RadixTree()
        node = tree.insert(tree.root, _key([1, 2, 3]))
        assert repr(node) == f"Node(id={node.id}, depth=3, edge=3)"
        node.has_state = True
        assert repr(node) == f"Node(id={node.id}, depth=3, edge=3 state)"


class TestTreeContracts:
    def test_salts_are_none_str_bytes_or_int_and_never_bool(self) -> None:
        for salt in (None, "a", b"a", 7):
            assert check_salt(salt) == salt
        for bad, name in ((True, "bool"), (1.5, "float"), ([1], "list")):
            with pytest.raises(ValueError, match=f"salt must be None, a str, bytes or an int, "
                                                 f"got {name}$"):
                check_salt(bad)

    def test_a_fresh_tree_and_node(self) -> None:
        tree = RadixTree()
        assert tree.root.id == 0 and tree.salt_of(tree.root) is None and tree.size == 0
        leaf = tree.insert(tree.root, _key([1, 2]))
        assert leaf.id == 1 and leaf.state is None and leaf.kv is None and leaf.pins == 0
        assert not leaf.has_state and leaf.depth == 2 and leaf.parent is tree.root

    def test_a_namespace_root_is_made_once_and_knows_its_salt(self) -> None:
        tree = RadixTree()
        tree.insert(tree.root, _key([1]))  # id 1
        root = tree.namespace("a")
        assert root is not tree.root and root.key == b"" and root.parent is None
        assert root.id == 2 and root.depth == 0 and tree.salt_of(root) == "a"
        assert tree.namespace("a") is root and tree.namespace(None) is tree.root
        assert tree.roots == {None: tree.root, "a": root}

    def test_match_reports_path_partial_offset_and_length(self) -> None:
        tree = RadixTree()
        top = tree.insert(tree.root, _key([1, 2, 3]))
        low = tree.insert(top, _key([4, 5]))
        other = tree.insert(tree.namespace("a"), _key([1, 2]))
        assert tree.match(_key([1, 2, 3, 4, 5])) == Match((top, low), None, 0, 5)
        assert tree.match(_key([1, 2, 3, 4, 5, 6])) == Match((top, low), None, 0, 5)
        assert tree.match(_key([1, 2, 3, 4, 9])) == Match((top,), low, 1, 4)
        assert tree.match(_key([1, 2, 3]), "absent") == Match((), None, 0, 0)
        assert tree.match(_key([1, 2, 3]), "a") == Match((other,), None, 0, 2)
        assert tree.path_to(low) == [top, low] and tree.path_to(tree.root) == []

    def test_split_needs_an_offset_inside_the_edge(self) -> None:
        tree = RadixTree()
        leaf = tree.insert(tree.root, _key([1, 2, 3]))
        for at in (0, 3):
            with pytest.raises(ValueError, match=f"split offset {at} outside edge of length 3"):
                tree.split(leaf, at)
        head = tree.split(leaf, 1)
        assert head.depth == 1 and leaf.parent is head and tree.size == 2
        tree.remove_leaf(leaf)
        detached = leaf  # an edge but no parent: not splittable
        with pytest.raises(AssertionError, match=r"^the root has no edge to split$"):
            tree.split(detached, 1)

    def test_insert_refuses_an_empty_or_taken_edge(self) -> None:
        tree = RadixTree()
        tree.insert(tree.root, _key([1, 2]))
        for key in (b"", _key([1, 5])):
            with pytest.raises(ValueError,
                               match=r"^insert needs a non-empty edge starting with a new token$"):
                tree.insert(tree.root, key)

    def test_removing_a_namespaces_last_leaf_drops_its_root(self) -> None:
        tree = RadixTree()
        root = tree.namespace("a")
        first = tree.insert(root, _key([1, 2]))
        second = tree.insert(root, _key([3]))
        default = tree.insert(tree.root, _key([1]))
        tree.remove_leaf(first)
        assert first.parent is None and tree.roots["a"] is root and tree.size == 2
        tree.remove_leaf(second)
        assert "a" not in tree.roots and root not in tree._salts and tree.size == 1
        tree.remove_leaf(default)  # the default namespace's root stays
        assert tree.roots == {None: tree.root} and tree._salts == {tree.root: None}
        tree.check()

    def test_check_names_what_is_wrong(self) -> None:
        def broken(corrupt) -> str:
            tree = RadixTree()
            top = tree.insert(tree.root, _key([1, 2]))
            tree.insert(top, _key([3]))
            corrupt(tree, top)
            with pytest.raises(AssertionError) as err:
                tree.check()
            return str(err.value)

        def lose_root(tree, top):
            tree.roots[None] = top

        def key_the_root(tree, top):
            tree.root.key = _key([9])

        def empty_namespace(tree, top):
            tree.roots["a"] = tree.namespace("a")

        def reparent(tree, top):
            (child,) = top.children.values()
            child.parent = tree.root

        def empty_edge(tree, top):
            (child,) = top.children.values()
            child.key = b""

        def refile(tree, top):
            top.children[_key([8])] = top.children.pop(_key([3]))

        def deepen(tree, top):
            top.depth = 3

        def miscount(tree, top):
            tree.size = 5

        assert broken(lose_root) == "the default namespace lost its root"
        assert broken(key_the_root).endswith("is not a root")
        assert broken(empty_namespace).startswith("empty namespace root Node(")
        assert broken(reparent).endswith("has the wrong parent")
        assert broken(empty_edge).endswith("has an empty edge")
        assert broken(refile).endswith("is filed under another token")
        assert broken(deepen).endswith("has a wrong depth")
        assert broken(miscount) == "tree counts 5 nodes, holds 2"


class TestAdmissionContracts:
    def test_block_checkpoints_end_at_the_input(self) -> None:
        block, empty = Block(4), Match((), None, 0, 0)
        assert block.checkpoints(empty, 12, 0) == (4, 8, 12)
        assert block.checkpoints(empty, 11, 0) == (4, 8)
        assert block.checkpoints(empty, 12, 4) == (8, 12)
        assert block.checkpoints(empty, 12, 5) == (8, 12)

    def test_block_positions_end_at_the_sequence_once(self) -> None:
        block, empty = Block(4), Match((), None, 0, 0)
        assert block.positions(empty, 8, 8) == (4, 8)
        assert block.positions(empty, 9, 8) == (4, 8, 9)
        assert block.positions(empty, 3, 3) == (3,)

    def test_block_sizes(self) -> None:
        assert Block().block == 32 and Block(1).block == 1
        for bad in (0, -1, 2.0):
            with pytest.raises(ValueError, match="block size must be a positive integer"):
                Block(bad)  # type: ignore[arg-type]

    def test_a_partial_block_is_superseded_only_by_a_longer_sequence(self) -> None:
        tree = RadixTree()
        partial = tree.insert(tree.root, _key(_seq(0, 10)))
        partial.has_state = True
        assert Block(4).superseded([partial], 10) == ()
        assert Block(4).superseded([partial], 12) == (partial,)

    def test_judicious_checkpoints_lie_after_the_hit(self) -> None:
        tree = RadixTree()
        leaf = tree.insert(tree.root, _key(_seq(0, 8)))
        leaves = Match((), leaf, 5, 5)  # the input leaves the edge after 5 tokens
        assert Judicious().checkpoints(leaves, 9, 0) == (5,)
        assert Judicious().checkpoints(leaves, 9, 5) == ()
        assert Judicious().positions(leaves, 12, 9) == (5, 12)

    def test_a_stateless_branch_node_is_a_branch_point(self) -> None:
        tree = RadixTree()
        branch = tree.insert(tree.root, _key([1, 2]))
        tree.insert(branch, _key([3]))
        tree.insert(branch, _key([4]))
        at_branch = Match((branch,), None, 0, 2)
        assert branch_point(at_branch, 5) == 2
        branch.has_state = True
        assert branch_point(at_branch, 5) is None
        assert branch_point(at_branch, 2) is None


class TestStats:
    def test_every_counter_moves_by_what_it_is_told(self) -> None:
        s = CacheStats()
        s.record_lookup(10, 4)
        s.record_lookup(6, 0)
        s.add_bytes(kv=100, ssm=30, states=2)
        s.add_bytes(kv=-50, ssm=0)
        s.record_eviction(20, 15, state=True)
        s.record_eviction(5, 0, state=False)
        s.record_replacement(10, kv=3)
        s.record_replacement(5)
        assert s.as_dict() == {
            "lookups": 2, "commits": 0, "input_tokens": 16, "hit_tokens": 4,
            "hit_requests": 1, "states_admitted": 0, "states_evicted": 1,
            "states_not_captured": 0, "states_replaced": 2, "evictions": 2,
            "refused_commits": 0, "evicted_then_refused": 0, "kv_bytes": 22, "ssm_bytes": 0,
            "states": -1, "peak_bytes": 130, "bytes": 22}

    def test_a_copy_is_equal_and_independent(self) -> None:
        s = CacheStats(lookups=3, kv_bytes=7, ssm_bytes=5)
        c = s.copy()
        assert c == s and c is not s and c.bytes == 12
        c.lookups += 1
        assert s.lookups == 3


class TestPolicies:
    def test_alpha_is_a_finite_number_at_least_zero(self) -> None:
        assert check_alpha(1) == 1.0 and isinstance(check_alpha(1), float)
        assert check_alpha(0) == 0.0
        for bad in (True, -0.5, float("inf"), float("nan"), "1"):
            with pytest.raises(ValueError, match="alpha must be a finite number >= 0, got"):
                check_alpha(bad)  # type: ignore[arg-type]

    def test_only_a_policy_with_an_alpha_sets_it(self) -> None:
        with pytest.raises(ValueError, match=r"^LRULeaf has no alpha to set$"):
            LRULeaf().set_alpha(1.0)
        policy = FlopAware(SMALL, 0.5)
        policy.set_alpha(2)
        assert policy.alpha == 2.0
        with pytest.raises(ValueError, match="alpha must be"):
            policy.set_alpha(-1.0)
        assert make_cache(SMALL, "1TB", "sglang+").alpha == 0.0
        assert make_cache(SMALL, "1TB", "marconi", alpha=1.5).alpha == 1.5

    def test_fresh_is_an_empty_policy_like_this_one(self) -> None:
        policy = FlopAware(SMALL, 0.5, Recency.INVERSE_AGE)
        tree = RadixTree()
        policy.on_commit([], [tree.insert(tree.root, _key([1, 2]))], 3)
        fresh = policy.fresh(1.25)
        assert type(fresh) is FlopAware and fresh is not policy
        assert fresh.spec is SMALL and fresh.recency is Recency.INVERSE_AGE
        assert fresh.alpha == 1.25 and len(fresh.columns) == 0 and fresh.stamp == {}
        assert len(policy.columns) == 1 and policy.alpha == 0.5

    def test_restore_loads_stamps_into_the_victim_order(self) -> None:
        tree = RadixTree()
        a = tree.insert(tree.root, _key([1]))
        b = tree.insert(tree.root, _key([2]))
        for policy in (LRULeaf(), FlopAware(SMALL)):
            policy.on_commit([], [a, b], 1)  # equal stamps: a (lower id) first
            policy.restore({a: 9.0, b: 4.0})
            assert policy.stamp == {a: 9.0, b: 4.0}
            victim = policy.victim((), 10)
            assert victim == Victim(b, Action.REMOVE), type(policy).__name__

    def test_a_removed_node_leaves_the_books(self) -> None:
        tree = RadixTree()
        a = tree.insert(tree.root, _key([1]))
        b = tree.insert(tree.root, _key([2]))
        policy = FlopAware(SMALL)
        policy.on_commit([], [a, b], 1)
        tree.remove_leaf(a)
        policy.removed(a)
        assert policy.candidates() == [b] and policy.stamp == {b: 1}
        policy.removed(a)  # twice is harmless
        assert policy.victim((), 2) == Victim(b, Action.REMOVE)
        assert policy.victim({b}, 2) is None


class TestCacheBooks:
    def test_floor_counts_pinned_and_protected_entries(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20)
        cache.commit(_seq(1000, 30), 30)
        first = cache.lookup(_seq(0, 20)).node
        second = cache.lookup(_seq(1000, 30)).node
        assert cache.floor() == 0
        cache.pin(first)
        assert cache.floor() == ENTRY
        assert cache.floor({second}) == ENTRY + 30 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        assert cache.floor({first}) == ENTRY  # pinned and protected counts once

    def test_a_grown_partial_block_replaces_its_state(self) -> None:
        cache = make_cache(SMALL, "1TB", "vllm+")  # blocks of 32
        cache.commit(_seq(0, 40), 40)  # states at 32 and 40
        held = cache.stats.copy()
        assert held.states == 2 and held.ssm_bytes == 2 * SMALL.ssm_bytes
        cache.commit(_seq(0, 70), 70)  # 40 grows in place: states at 32, 64, 70
        s = cache.stats
        assert (s.states_replaced, s.states, s.states_admitted, s.evictions) == (1, 3, 4, 0)
        assert s.ssm_bytes == 3 * SMALL.ssm_bytes
        assert s.kv_bytes == 70 * SMALL.kv_bytes_per_token
        assert sorted(n.depth for n in cache.tree.nodes() if n.has_state) == [32, 64, 70]
        check_integrity(cache)

    def test_lookup_and_peek_plan_alike_but_only_lookup_counts(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 20)
        probe = [*_seq(0, 20), 7, 8]
        clock, stats = cache.clock, cache.stats.copy()
        plan = cache.peek(probe)
        assert plan.hit == 20 and plan.matched == 20 and plan.n_input == 22
        assert plan.checkpoints == () and plan.node is not None and plan.node.depth == 20
        assert cache.clock == clock and cache.stats == stats
        assert cache.lookup(probe) == plan
        assert cache.clock == clock + 1 and cache.stats.lookups == stats.lookups + 1
        assert cache.stats.hit_tokens == stats.hit_tokens + 20


class _Marks(Judicious):
    """An admission that also checkpoints every message boundary and the end of the
    token bytes it is shown (at commit: their middle), as structure-aware policies read
    them."""

    def checkpoints_at(self, match, n_input, hit, boundaries, tokens=b""):
        marks = {*boundaries, len(tokens) // 4}
        return tuple(sorted(p for p in marks if hit < p <= n_input))

    def positions_at(self, match, n_total, n_input, boundaries, tokens=b""):
        return tuple(sorted({*boundaries, len(tokens) // 8, n_total} - {0}))


class TestWhatPoliciesAreTold:
    def test_peek_and_required_states_pass_boundaries_and_tokens_on(self) -> None:
        cache = PrefixCache(SMALL, "1TB", _Marks(), LRULeaf())
        assert cache.peek(_seq(0, 12), boundaries=(5,)).checkpoints == (5, 12)
        assert cache.lookup(_seq(0, 12), boundaries=(5,)).checkpoints == (5, 12)
        assert cache.required_states(_seq(0, 12), 10, boundaries=(5,)) == (5, 6, 12)
        assert _Marks().preview(Match((), None, 0, 0), 12, 0, (3,)) == (3,)
        with pytest.raises(ValueError, match=r"^peek: empty token list$"):
            cache.peek([])

    def test_flop_aware_books_check_names_the_difference(self) -> None:
        tree = RadixTree()
        a = tree.insert(tree.root, _key([1]))
        policy = FlopAware(SMALL)
        policy.changed(a)  # a candidate never stamped: recency 0
        policy.check([a])
        b = tree.insert(tree.root, _key([2]))
        with pytest.raises(AssertionError,
                           match=r"^candidates differ: extra set\(\), missing \{Node\(id=2, "):
            policy.check([a, b])
        policy.changed(b)
        tree.remove_leaf(a)
        with pytest.raises(AssertionError, match=r"^candidates differ: extra \{Node\(id=1, "):
            policy.check([b])


class TestPagedMerges:
    def test_merging_a_page_copy_keeps_the_books_exact(self) -> None:
        freed: list[Freed] = []
        cache = make_cache(SMALL, "1TB", "marconi", page_size=4, on_evict=freed.append)
        cache.commit(_seq(0, 10), 10)
        cache.commit([*_seq(0, 6), *_seq(50, 6)], 12)  # a branch at 6, inside page [4, 8)
        cache.commit(_seq(100, 8), 8)
        cache.lookup([*_seq(0, 6), *_seq(50, 6), 1])  # touches the branch's tail only
        while cache.bytes:
            cache.evict(1)
            check_integrity(cache)
        assert Action.MERGE in {f.action for f in freed}
        assert sum(f.nbytes for f in freed) == cache.stats.peak_bytes


class _Listening(LRULeaf):
    """LRU over leaves that keeps every `Pressure` it is told (as two-list policies read
    it to choose a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[Pressure] = []

    def pressure(self, pressure: Pressure) -> None:
        self.told.append(pressure)


class TestPressure:
    KV = 20 * SMALL.kv_bytes_per_token

    def test_a_listening_policy_is_told_what_is_held_and_needed(self) -> None:
        policy = _Listening()
        cache = PrefixCache(SMALL, 2 * ENTRY, Judicious(), policy)
        for start in (0, 1000, 2000):
            cache.commit(_seq(start, 20), 20)
        assert policy.told == [Pressure(kv_held=2 * self.KV, kv_need=self.KV,
                                        ssm_held=2 * SMALL.ssm_bytes, ssm_need=SMALL.ssm_bytes,
                                        capacity=2 * ENTRY, ssm_capacity=None)]
        cache.evict(1)
        assert policy.told[1] == Pressure(kv_held=2 * self.KV, ssm_held=2 * SMALL.ssm_bytes,
                                          capacity=2 * ENTRY)

    def test_a_state_pool_is_told_as_its_own_capacity(self) -> None:
        policy = _Listening()
        cache = PrefixCache(SMALL, 2 * ENTRY, Judicious(), policy, state_slots=2)
        for start in (0, 1000, 2000):
            cache.commit(_seq(start, 20), 20)
        assert policy.told[0] == Pressure(
            kv_held=2 * self.KV, kv_need=self.KV, ssm_held=2 * SMALL.ssm_bytes,
            ssm_need=SMALL.ssm_bytes, capacity=2 * self.KV, ssm_capacity=2 * SMALL.ssm_bytes)


class TestUnstamped:
    def test_an_unstamped_leaf_is_a_victim_at_time_zero(self) -> None:
        tree = RadixTree()
        a = tree.insert(tree.root, _key([1]))
        b = tree.insert(tree.root, _key([2]))
        policy = LRULeaf()
        policy.on_commit([b], [b], 5)
        policy.changed(a)  # never stamped
        assert policy.victim((), 6) == Victim(a, Action.REMOVE)
        policy.check([a, b])


class _Stubborn(LRULeaf):
    """A broken policy that never names a victim."""

    def victim(self, protected, now):
        return None


class TestFeasibility:
    def test_an_exact_fit_beside_a_pinned_entry_is_feasible(self) -> None:
        for slots in (0, 2):
            cache = make_cache(SMALL, 2 * ENTRY, "sglang+", state_slots=slots)
            cache.commit(_seq(0, 20), 20)
            cache.commit(_seq(1000, 20), 20)
            cache.pin(cache.lookup(_seq(0, 20)).node)
            result = cache.commit(_seq(2000, 20), 20)
            assert not result.refused and cache.stats.evictions == 1, slots
            assert cache.bytes == 2 * ENTRY

    def test_a_full_state_pool_refuses_before_evicting(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+", state_slots=1)
        cache.commit(_seq(0, 20), 20)
        cache.pin(cache.lookup(_seq(0, 20)).node)
        assert cache.commit(_seq(1000, 20), 20).refused
        s = cache.stats
        assert (s.refused_commits, s.evicted_then_refused, s.evictions) == (1, 0, 0)

    def test_a_policy_that_runs_out_gets_the_commit_refused(self) -> None:
        cache = PrefixCache(SMALL, 2 * ENTRY, Judicious(), _Stubborn())
        cache.commit(_seq(0, 20), 20)
        cache.commit(_seq(1000, 20), 20)
        assert cache.commit(_seq(2000, 20), 20).refused
        assert cache.commit(_seq(3000, 20), 20).refused
        s = cache.stats
        assert (s.refused_commits, s.evicted_then_refused, s.evictions) == (2, 2, 0)
        assert cache.bytes == 2 * ENTRY

    def test_an_evicted_node_lets_go_of_its_kv(self) -> None:
        store, freed = ListStore(), []
        cache = make_cache(SMALL, "1TB", "sglang+", store=store, on_evict=freed.append)
        cache.commit(_seq(0, 20), 20, states={20: "s20"}, kv=_seq(0, 20))
        node = cache.lookup(_seq(0, 20)).node
        assert node is not None and node.kv == _seq(0, 20)
        cache.evict(1)
        assert node.kv is None and node.state is None and not node.has_state
        assert freed == [Freed(Action.REMOVE, 20, _seq(0, 20), "s20", ENTRY)]
        assert store.released_kv == [_seq(0, 20)] and store.released_states == ["s20"]

    def test_flop_aware_starts_at_alpha_zero(self) -> None:
        assert FlopAware(SMALL).alpha == 0.0 and FlopAware(SMALL).recency is Recency.TIME


class _FirstFive(Judicious):
    """A state after the first five tokens only (`truncates`: keep nothing after it)."""

    def __init__(self, truncates: bool) -> None:
        self.truncates = truncates

    def positions(self, match, n_total, n_input):
        return (5,) if n_total >= 5 else ()


class TestCommit:
    def test_commit_counts_ticks_and_validates(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit(_seq(0, 20), 0)  # an empty input is allowed: all output
        cache.commit(_seq(0, 20), 20)
        assert cache.clock == 2 and cache.stats.commits == 2
        for call in ("commit", "lookup"):
            with pytest.raises(ValueError, match=f"^{call}: empty token list$"):
                getattr(cache, call)([], 0) if call == "commit" else cache.lookup([])
        with pytest.raises(ValueError, match=r"^commit: n_input=21 outside \[0, 20\]$"):
            cache.commit(_seq(0, 20), 21)

    def test_a_one_token_hit_counts_as_a_hit(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+")
        cache.commit([5], 1)
        assert cache.lookup([5, 6]).hit == 1 and cache.stats.hit_requests == 1

    def test_what_is_not_kept_is_released(self) -> None:
        store = ListStore()
        vanilla = make_cache(SMALL, "1TB", "vanilla", store=store)
        assert vanilla.commit(_seq(0, 20), 20, states={20: "a"}) == CommitResult(
            (), None, refused=False)
        refusing = PrefixCache(SMALL, ENTRY - 1, Judicious(), LRULeaf(), store=store)
        assert refusing.commit(_seq(0, 20), 20, states={20: "b"}) == CommitResult(
            (), None, refused=True)
        assert store.released_states == ["a", "b"] and store.released_kv == []

    def test_commit_hands_the_admission_boundaries_and_tokens(self) -> None:
        cache = PrefixCache(SMALL, "1TB", _Marks(), LRULeaf())
        assert cache.commit(_seq(0, 12), 10, boundaries=(3,)).admitted == (3, 6, 12)

    def test_only_a_truncating_admission_cuts_the_sequence(self) -> None:
        for truncates, kept in ((False, 12), (True, 5)):
            cache = PrefixCache(SMALL, "1TB", _FirstFive(truncates), LRULeaf())
            result = cache.commit(_seq(0, 12), 12, salt="a")
            assert result.admitted == (5,) and cache.tree.match(_key(_seq(0, 12)), "a").length \
                == kept
            again = cache.commit(_seq(0, 12), 12, salt="a")  # the same sequence: no new node
            assert again.admitted == () and cache.tree.size == (2 if kept == 12 else 1)
        cache = PrefixCache(SMALL, "1TB", _FirstFive(True), LRULeaf())
        assert cache.commit(_seq(0, 4), 4) == CommitResult((), None, refused=False)
        assert cache.tree.size == 0 and cache.bytes == 0


class TestConstruction:
    def test_defaults_and_layout_arguments_reach_the_cache(self) -> None:
        cache = PrefixCache(SMALL, "1TB", Judicious(), LRULeaf())
        assert cache.name == "custom" and cache.clock == 0
        assert cache.layout == Layout(page_size=1, state_slots=0)
        paged = PrefixCache(SMALL, "1TB", Judicious(), LRULeaf(), name="x", page_size=4,
                            state_slots=3)
        assert paged.name == "x" and paged.layout == Layout(page_size=4, state_slots=3)

    def test_bad_tokens_name_the_call(self) -> None:
        cache = PrefixCache(SMALL, "1TB", Judicious(), LRULeaf())
        with pytest.raises(ValueError, match=r"^lookup: tokens: token ids must be integers, "
                                             r"got dtype float64$"):
            cache.lookup([1.5])


class TestStatePool:
    def test_kv_past_its_share_of_a_state_pool_evicts(self) -> None:
        kv = 20 * SMALL.kv_bytes_per_token
        cache = make_cache(SMALL, 2 * kv + 3 * SMALL.ssm_bytes, "sglang+", state_slots=3)
        for start in (0, 1000, 2000):
            cache.commit(_seq(start, 20), 20)
        s = cache.stats
        assert (s.evictions, s.kv_bytes, s.states) == (1, 2 * kv, 2)
