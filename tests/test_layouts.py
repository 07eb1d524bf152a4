"""Memory layouts (docs/architecture.md, "Layouts"): KV in whole pages, states in a slot
pool, both checked against a paged store whose pages really are shared and copied."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from marconi.core.integrity import check_integrity
from marconi.core.layout import Layout
from marconi.core.policy import Action, Victim
from marconi.core.spec import PAPER_7B
from marconi.core.tree import Node
from marconi.systems import make_cache
from tests.helpers import CACHES, SMALL, examples
from tests.paging import PagedListStore

KV = SMALL.kv_bytes_per_token  # 256 B
STATE = SMALL.ssm_bytes


def _commit(cache, store: PagedListStore, inp: list[int], out: list[int], salt=None):
    full = inp + out
    wanted = cache.required_states(full, len(inp), salt=salt)
    states = store.track({p: ("state", p) for p in wanted})
    return cache.commit(full, len(inp), states=states, kv=full, salt=salt)


def _paged(system: str, page: int, capacity: int | str = "1TB", slots: int = 0):
    store = PagedListStore(page)
    return make_cache(SMALL, capacity, system, store=store, page_size=page,
                      state_slots=slots), store


class TestArguments:
    @pytest.mark.parametrize(("kwargs", "field"), [
        ({"page_size": 0}, "page_size"), ({"page_size": True}, "page_size"),
        ({"page_size": 2.5}, "page_size"), ({"state_slots": -1}, "state_slots")])
    def test_bad_knobs_name_the_field(self, kwargs, field):
        with pytest.raises(ValueError, match=field):
            make_cache(SMALL, "1GB", "marconi", **kwargs)

    def test_a_pool_bigger_than_the_capacity_is_refused(self):
        with pytest.raises(ValueError, match="state_slots=3"):
            make_cache(SMALL, 2 * STATE, "marconi", state_slots=3)

    @pytest.mark.parametrize("system", sorted(n for n, s in CACHES.items()
                                              if s.engine_layout is None))
    def test_defaults_are_the_single_byte_budget(self, system):
        cache = make_cache(SMALL, "1GB", system)
        assert cache.layout == Layout() and cache.kv_capacity == cache.capacity

    @pytest.mark.parametrize(("system", "layout"), [
        ("sglang-2026", Layout(page_size=1, state_slots=34)),
        ("sglang-2026-extra", Layout(page_size=1, state_slots=34)),
        ("vllm-2026", Layout(page_size=80))])
    def test_peers_run_their_engines_layout_unless_told(self, system, layout):
        assert make_cache(PAPER_7B, "2GB", system).layout == layout
        plain = make_cache(PAPER_7B, "2GB", system, page_size=1, state_slots=0)
        assert plain.layout == Layout()


class TestPages:
    def test_a_sequence_holds_whole_pages(self):
        cache, store = _paged("sglang+", 4)
        _commit(cache, store, list(range(7)), [100, 101, 102])
        assert cache.stats.kv_bytes == 3 * 4 * KV  # 10 tokens in 3 pages of 4
        check_integrity(cache)

    def test_a_split_inside_a_page_shares_it_and_a_branch_copies_it(self):
        cache, store = _paged("sglang+", 4)
        _commit(cache, store, list(range(10)), [])
        _commit(cache, store, [*range(6), 50, 51, 52, 53, 54, 55], [])
        # [0, 6) pages 0 and 4; tail [6, 10) page 8, sharing 4; branch [6, 12): a copy of
        # page 4 (tokens 4, 5 and its own 6, 7) and page 8
        assert cache.stats.kv_bytes == 5 * 4 * KV
        assert store.pool.in_use == 5
        check_integrity(cache)

    def test_a_split_branch_keeps_its_copy_in_the_head(self):
        cache, store = _paged("sglang+", 4)
        _commit(cache, store, list(range(10)), [])
        _commit(cache, store, [*range(6), 50, 51, 52, 53, 54, 55], [])
        _commit(cache, store, [*range(6), 50, 51, 52, 99], [])  # splits the branch at 9
        assert store.pool.in_use * 4 * KV == cache.stats.kv_bytes == 6 * 4 * KV
        check_integrity(cache)

    @pytest.mark.parametrize(("inputs", "freed"), [
        # [1] | [2, 3] (a branch inside page 0: its own copy) | [4, 5, 0] (the split tail,
        # sharing that copy) and [9, 0]: the merge keeps [1]'s page 0 for [1, 2, 3], so
        # the copy stays, held by the tail alone (the books once freed it: a page more in
        # the store than in the books, and a paged engine's pool overrun)
        ([[1], [1, 2, 3, 4, 5, 0], [1, 2, 3, 9, 0]], 0),
        # [2, 3]'s only child [9] is a branch with a copy of its own: the copy is freed
        ([[1], [1, 2, 3], [1, 2, 3, 9]], 1),
        # [2 .. 6] ends in page 4, not in the copied page 0: the tail [7] shares page 4
        # and the copy is freed
        ([[1], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 9]], 1),
    ])
    def test_a_merge_frees_the_child_s_copy_unless_a_grandchild_shares_it(self, inputs,
                                                                          freed):
        cache, store = _paged("sglang+", 4)
        for inp in inputs:
            _commit(cache, store, inp, [])
        one = cache.tree.match(np.array([1], np.int32).tobytes()).node
        assert one is not None and len(one.children) == 1
        before = cache.stats.kv_bytes
        cache._evict(Victim(one, Action.MERGE))
        assert store.pool.in_use * 4 * KV == cache.stats.kv_bytes == before - freed * 4 * KV
        check_integrity(cache)

    def test_the_state_machine_s_merge_case(self):
        """The case `LayoutMachine` found (marconi+, a state pool): its merge hit the copy
        a grandchild shares."""
        cache, store = _paged("marconi+", 4, 20 * KV + 4 * STATE, 4)
        for inp in ([1], [0], [0], [1, 2, 3, 4, 5, 0], [1, 2, 3, 9, 0], [0]):
            cache.lookup(inp)
            _commit(cache, store, inp, [])
            assert store.pool.in_use * 4 * KV == cache.stats.kv_bytes
        check_integrity(cache)

    @pytest.mark.parametrize("page", [3, 16])
    def test_a_growing_block_chain_frees_its_seam_copies(self, page):
        """vLLM+'s partial block grows in place: the merge frees the copy the extension
        made of the seam page, so one conversation holds ceil(n / P) pages."""
        cache, store = _paged("vllm+", page)
        history: list[int] = []
        for turn in range(6):
            inp = history + [1000 * turn + i for i in range(11)]
            _commit(cache, store, inp, [7] * 4)
            history = inp + [7] * 4
            assert cache.stats.kv_bytes == math.ceil(len(history) / page) * page * KV
            assert store.pool.in_use * page * KV == cache.stats.kv_bytes
        check_integrity(cache)


class TestStateSlots:
    def test_never_more_states_than_slots_and_kv_within_the_rest(self):
        capacity = 3 * STATE + 200 * KV
        cache, store = _paged("sglang+", 1, capacity, slots=3)
        for i in range(20):
            _commit(cache, store, [i, *range(100, 110)], [i])
            assert cache.stats.states <= 3 and store.states == cache.stats.states
            assert cache.stats.kv_bytes <= 200 * KV == cache.kv_capacity
        assert cache.stats.evictions > 0
        check_integrity(cache)

    def test_slots_bind_even_when_bytes_are_free(self):
        cache = make_cache(SMALL, "1TB", "sglang+", state_slots=2)
        for i in range(5):
            cache.commit([i, 1, 2, 3], 3)
        assert cache.stats.states == 2 and cache.stats.evictions == 3


class TestFeasibility:
    """A sequence that cannot fit beside what is pinned is refused with nothing evicted,
    under pages and under slots alike."""

    def _refused(self, cache, inp: list[int]) -> None:
        before = cache.stats.copy()
        result = cache.commit(inp, len(inp))
        assert result.refused
        assert cache.stats.evictions == before.evictions
        assert cache.stats.kv_bytes == before.kv_bytes
        check_integrity(cache)

    def test_pages_beside_a_pinned_path_count_the_branch_copy(self):
        cache = make_cache(SMALL, 4 * 4 * KV + 2 * STATE, "sglang+", page_size=4,
                           state_slots=2)  # KV budget: 4 pages
        first = cache.commit(list(range(9)), 9)  # pages 0, 4, 8
        cache.commit([500, 501], 2)  # a 4th page: evictable, must stay
        cache.pin(first.node)
        # tail [9, 13): page 12 and its own copy of page 8: 3 + 2 > 4 even with [500, 501] gone
        self._refused(cache, [*range(9), 600, 601, 602, 603])

    def test_slots_beside_a_pinned_path(self):
        cache = make_cache(SMALL, "1TB", "sglang+", state_slots=1)
        first = cache.commit(list(range(9)), 9)
        cache.pin(first.node)
        self._refused(cache, [700, 701])


class LayoutMachine(RuleBasedStateMachine):
    """Random traffic under random layouts and namespaces; after every step the books
    agree with a full walk, and with a store that really shares and copies pages."""

    @initialize(system=st.sampled_from(sorted(CACHES)), page=st.sampled_from([1, 2, 3, 4, 8]),
                slots=st.integers(0, 4), kv_room=st.integers(0, 300))
    def make(self, system: str, page: int, slots: int, kv_room: int) -> None:
        capacity = kv_room * KV + (slots or 3) * STATE
        self.cache, self.store = _paged(system, page, capacity, slots)
        self.pinned: list[Node] = []

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4, 5], [1, 2, 3, 9], [6] * 9]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=12),
          out=st.lists(st.integers(0, 3), max_size=5),
          salt=st.sampled_from([None, None, None, "a", 7]))
    def request(self, prefix: list[int], tail: list[int], out: list[int], salt) -> None:
        inp = prefix + tail
        plan = self.cache.lookup(inp, salt=salt)
        if plan.node is not None:
            spelled = [t for n in self.cache.path(plan.node) for t in self.store.tokens(n.kv)]
            assert spelled == inp[: plan.hit]
        _commit(self.cache, self.store, inp, out, salt)

    @precondition(lambda self: self.cache.tree.size > 0)
    @rule(i=st.integers(0, 50))
    def pin(self, i: int) -> None:
        nodes = self.cache.tree.nodes()
        self.cache.pin(nodes[i % len(nodes)])
        self.pinned.append(nodes[i % len(nodes)])

    @precondition(lambda self: bool(self.pinned))
    @rule(i=st.integers(0, 10))
    def unpin(self, i: int) -> None:
        self.cache.unpin(self.pinned.pop(i % len(self.pinned)))

    @rule(nbytes=st.integers(0, 200_000))
    def evict(self, nbytes: int) -> None:
        self.cache.evict(nbytes)

    @invariant()
    def consistent(self) -> None:
        check_integrity(self.cache)
        page_bytes = self.cache.layout.page_size * KV
        assert self.store.pool.in_use * page_bytes == self.cache.stats.kv_bytes
        assert self.store.states == self.cache.stats.states
        for node in self.cache.tree.nodes():
            assert self.store.tokens(node.kv) == node.tokens().tolist()


TestLayoutMachine = LayoutMachine.TestCase
TestLayoutMachine.settings = settings(max_examples=examples(150), stateful_step_count=30,
                                      deadline=None)


class TestSimulator:
    def test_page_size_and_state_slots_reach_the_replay(self, capsys):
        from marconi.cli import main

        args = ["simulate", "synthetic:multi-turn", "--sessions", "8", "--capacity", "400MB",
                "--system", "sglang+", "--json", "--quiet", "--no-bounds", "--replay",
                "sequential"]
        runs = {}
        for extra in ([], ["--page-size", "64"], ["--state-slots", "4"]):
            assert main([*args, *extra]) == 0
            runs[" ".join(extra)] = json.loads(capsys.readouterr().out)
        plain, paged, slots = runs.values()
        page = 64 * PAPER_7B.kv_bytes_per_token
        assert paged["kv_bytes_final"] % page == 0 and plain["kv_bytes_final"] % page
        assert slots["ssm_bytes_final"] <= 4 * PAPER_7B.ssm_bytes < plain["ssm_bytes_final"]

    @pytest.mark.parametrize(("extra", "word"), [
        (["--page-size", "0"], "--page-size: '0' is not a whole number >= 1"),
        (["--state-slots", "-2"], "--state-slots: '-2' is not a whole number >= 0"),
        (["--state-slots", "1000"], "exceeds capacity")])
    def test_bad_layouts_exit_2_naming_the_field(self, capsys, extra, word):
        from marconi.cli import main

        try:  # a value the flag refuses ends the parse; one the capacity refuses, the run
            code = main(["simulate", "synthetic:multi-turn", "--sessions", "2", "--quiet",
                         "--capacity", "1GB", *extra])
        except SystemExit as end:
            code = end.code
        assert code == 2
        assert word in capsys.readouterr().err


class TestEngineLayouts:
    """The layouts the peers' engines use, at a given memory."""

    def test_sglang_pools_its_share_of_the_memory(self):
        from marconi.peers.mamba_radix import sglang_layout

        layout = sglang_layout(PAPER_7B, 2 * 10**9)
        assert layout == Layout(page_size=1, state_slots=34)  # (2e9 x 0.9 / 1.9 - s) // s
        assert layout.kv_capacity(PAPER_7B, 2 * 10**9) == 2 * 10**9 - 34 * PAPER_7B.ssm_bytes
        assert sglang_layout(PAPER_7B, PAPER_7B.ssm_bytes) == Layout()  # no whole slot

    def test_vllm_pages_are_its_blocks(self):
        from marconi.peers.mamba_align import vllm_block_tokens, vllm_layout

        assert vllm_layout(PAPER_7B, 10**9) == Layout(page_size=vllm_block_tokens(PAPER_7B))
        assert vllm_block_tokens(PAPER_7B) == 80

    def test_a_run_says_which_layout_it_ran(self, capsys):
        from marconi.cli import main

        args = ["simulate", "synthetic:multi-turn", "--sessions", "3", "--capacity", "2GB",
                "--json", "--quiet", "--no-bounds", "--system"]
        assert main([*args, "vllm-2026"]) == 0
        out, err = capsys.readouterr()
        assert (json.loads(out)["page_size"], json.loads(out)["state_slots"]) == (80, 0)
        assert "layout: vllm-2026 runs KV in pages of 80 tokens" in err
        assert main([*args, "sglang-2026", "--state-slots", "0"]) == 0
        out, err = capsys.readouterr()
        assert (json.loads(out)["page_size"], json.loads(out)["state_slots"]) == (1, 0)
        assert "layout:" not in err  # the paper's single byte budget goes unremarked
