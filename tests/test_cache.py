from __future__ import annotations

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.spec import PAPER_7B
from marconi.systems import make_cache
from tests.helpers import CACHES, SMALL, ListStore

# the byte budget, for peers that default to their engine's layout (pages and slots under
# the same refusal rule: tests/test_layouts.py)
BYTES = {"page_size": 1, "state_slots": 0}


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _request(cache: PrefixCache, inp: list[int], out: list[int]) -> int:
    plan = cache.lookup(inp)
    cache.commit(inp + out, len(inp), kv=inp + out)
    return plan.hit


class TestFigure4:
    """The paper's Figure 4 shapes."""

    def test_shared_prefix_checkpointed_on_second_hit_on_third(self) -> None:
        cache = make_cache(PAPER_7B, "1TB", "marconi")
        system = _seq(0, 100)
        first = cache.lookup(system + _seq(1000, 20))
        assert (first.hit, first.checkpoints) == (0, ())
        cache.commit(system + _seq(1000, 20) + [1, 2], 120)
        second = cache.lookup(system + _seq(2000, 20))
        assert (second.hit, second.checkpoints) == (0, (100,))
        result = cache.commit(system + _seq(2000, 20) + [3], 120)
        assert result.admitted == (100, 121)
        third = cache.lookup(system + _seq(3000, 20))
        assert third.hit == 100 and third.checkpoints == ()

    def test_conversation_resumes_at_last_token_of_previous_turn(self) -> None:
        cache = make_cache(PAPER_7B, "1TB", "marconi")
        turn1, out1 = _seq(0, 50), _seq(500, 30)
        _request(cache, turn1, out1)
        plan = cache.lookup(turn1 + out1 + _seq(900, 10))
        assert plan.hit == 80 and plan.node is not None and plan.node.has_state

    def test_at_most_two_states_per_request(self) -> None:
        cache = make_cache(PAPER_7B, "1TB", "sglang+")
        _request(cache, _seq(0, 300), [1])
        result = cache.commit(_seq(0, 100) + _seq(5000, 300), 400)
        assert result.admitted == (100, 400)  # the branch point and the end

    def test_exact_repeat_hits_whole_input(self) -> None:
        cache = make_cache(PAPER_7B, "1TB", "sglang+")
        _request(cache, _seq(0, 40), [])
        assert cache.lookup(_seq(0, 40)).hit == 40


class TestFlopAware:
    """A long sequence that LRU drops is kept by FLOP-aware eviction."""

    def _fill(self, system: str, alpha: float | None) -> PrefixCache:
        long_bytes = 1000 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        short_bytes = 10 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        cache = make_cache(SMALL, long_bytes + 2 * short_bytes + 40_000, system, alpha=alpha)
        _request(cache, _seq(0, 1000), [])
        _request(cache, _seq(10_000, 10), [])
        _request(cache, _seq(20_000, 10), [])
        _request(cache, _seq(30_000, 10), [])  # needs room: one entry must go
        check_integrity(cache)
        return cache

    def test_lru_drops_the_long_sequence(self) -> None:
        cache = self._fill("sglang+", None)
        assert cache.lookup(_seq(0, 1000)).hit == 0

    def test_flop_aware_keeps_it(self) -> None:
        cache = self._fill("marconi", 2.0)
        assert cache.lookup(_seq(0, 1000)).hit == 1000
        assert cache.lookup(_seq(10_000, 10)).hit == 0  # the oldest short one left instead

    def test_alpha_zero_drops_it(self) -> None:
        cache = self._fill("marconi", 0.0)
        assert cache.lookup(_seq(0, 1000)).hit == 0

    def test_one_child_node_evicted_by_merging(self) -> None:
        store = ListStore()
        cache = make_cache(SMALL, "1TB", "marconi", alpha=0.0, store=store)
        turn1 = _seq(0, 20)
        _request(cache, turn1, [])
        _request(cache, turn1 + _seq(100, 20), [])  # chain: node@20 -> node@40
        cache.capacity = cache.bytes - 1
        cache.evict(1)
        check_integrity(cache)
        (node,) = cache.tree.root.children.values()  # the older node merged into its child
        assert node.depth == 40 and not node.children and node.kv == turn1 + _seq(100, 20)
        assert cache.lookup(turn1 + _seq(100, 20)).hit == 40
        assert cache.stats.states_evicted == 1 and cache.stats.kv_bytes == 40 * 256


class TestCapacity:
    @pytest.mark.parametrize("system", list(CACHES))
    def test_never_over_capacity(self, system: str) -> None:
        rng = np.random.default_rng(0)
        cache = make_cache(SMALL, 600_000, system, alpha=0.5)
        for _ in range(60):
            base = int(rng.integers(0, 4)) * 1000
            inp = _seq(base, int(rng.integers(5, 200))) + rng.integers(0, 9, 30).tolist()
            _request(cache, inp, rng.integers(0, 9, 5).tolist())
            assert cache.bytes <= cache.capacity
        check_integrity(cache)

    def test_too_big_is_refused_not_overflowed(self) -> None:
        cache = make_cache(SMALL, 50_000, "sglang+")
        result = cache.commit(_seq(0, 500), 500)
        assert result.refused and cache.bytes == 0 and cache.stats.refused_commits == 1

    @pytest.mark.parametrize("system", ["vllm+", "sglang+", "marconi", "sglang-2026",
                                        "vllm-2026", "marconi+"])
    def test_refusal_evicts_nothing(self, system: str) -> None:
        """A sequence that cannot fit even in an empty cache is bypassed before any
        eviction: what the cache held stays, and still hits."""
        probe = make_cache(SMALL, "1TB", system, **BYTES)
        for start in (0, 10_000):
            _request(probe, _seq(start, 200), [1])
        # room for the two 200-token entries (and for what vLLM holds while one runs: all
        # it computed, two working states, its null block), not for one of 3,000 tokens
        cache = make_cache(SMALL, probe.bytes + 400_000, system, **BYTES)
        for start in (0, 10_000):
            _request(cache, _seq(start, 200), [1])
        held = cache.bytes
        assert held == probe.bytes
        result = cache.commit(_seq(50_000, 3000), 3000)
        assert result.refused and cache.stats.refused_commits == 1
        assert cache.bytes == held and cache.stats.evictions == 0
        resumed = [*_seq(0, 200), 1, 3]  # vLLM's align mode resumes at a block boundary,
        # SGLang's before the last sampled token (never fed)
        assert cache.lookup(resumed).hit == probe.lookup(resumed).hit \
            == {"vllm-2026": 192, "sglang-2026": 200}.get(system, 201)
        check_integrity(cache)

    def test_refusal_counts_pinned_bytes(self) -> None:
        """What is pinned cannot be freed: a commit that fits only without it is refused
        and leaves the unpinned entries alone."""
        entry = 201 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        cache = make_cache(SMALL, 2 * entry + 10_000, "sglang+")
        _request(cache, _seq(0, 200), [1])
        _request(cache, _seq(10_000, 200), [1])
        cache.pin(cache.lookup([*_seq(0, 200), 1, 5]).node)
        result = cache.commit(_seq(50_000, 200), 200)  # fits beside one entry, not beside both
        assert not result.refused and cache.stats.evictions == 1  # the unpinned one left
        assert cache.lookup([*_seq(0, 200), 1, 5]).hit == 201
        bigger = cache.commit(_seq(90_000, 300), 300)  # would need the pinned entry's bytes
        assert bigger.refused and cache.stats.evictions == 1
        assert cache.lookup([*_seq(50_000, 200), 2]).hit == 200
        check_integrity(cache)

    def test_vanilla_caches_nothing(self) -> None:
        cache = make_cache(PAPER_7B, "1TB", "vanilla")
        _request(cache, _seq(0, 10), [1])
        assert cache.lookup(_seq(0, 10)).hit == 0 and cache.bytes == 0


class TestPins:
    def test_pinned_node_survives_pressure(self) -> None:
        cache = make_cache(SMALL, 400_000, "sglang+")
        _request(cache, _seq(0, 100), [])
        plan = cache.lookup([*_seq(0, 100), 7])
        cache.pin(plan.node)
        for i in range(10):
            _request(cache, _seq(10_000 * (i + 1), 100), [])
        assert plan.node is not None and plan.node.parent is not None
        assert cache.lookup([*_seq(0, 100), 7]).hit == 100
        cache.unpin(plan.node)
        check_integrity(cache)

    def test_unpin_without_pin(self) -> None:
        cache = make_cache(SMALL, "1TB", "marconi")
        _request(cache, _seq(0, 10), [])
        node = cache.lookup(_seq(0, 10)).node
        with pytest.raises(ValueError, match="not pinned"):
            cache.unpin(node)


class TestStore:
    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm+"])
    def test_path_kv_spells_the_prefix(self, system: str) -> None:
        store = ListStore()
        cache = make_cache(SMALL, 2_000_000, system, alpha=1.0, store=store)
        rng = np.random.default_rng(1)
        for _ in range(40):
            inp = _seq(int(rng.integers(0, 3)) * 100, 60) + rng.integers(0, 5, 20).tolist()
            full = inp + rng.integers(0, 5, 4).tolist()
            cache.lookup(inp)
            states = {p: f"state@{p}" for p in cache.required_states(full, len(inp))}
            cache.commit(full, len(inp), states=states, kv=full)
        for node in cache.tree.nodes():
            kv = [t for n in cache.path(node) for t in n.kv]
            assert kv == [t for n in cache.path(node) for t in n.tokens().tolist()]
            assert (node.state == f"state@{node.depth}") == node.has_state
        assert len(store.released_states) == cache.stats.states_evicted > 0

    def test_uncaptured_state_not_admitted(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+", store=ListStore())
        result = cache.commit(_seq(0, 10), 10, states={}, kv=_seq(0, 10))
        assert result.admitted == () and cache.stats.states_not_captured == 1
        assert cache.lookup(_seq(0, 10)).hit == 0

    def test_unused_states_released(self) -> None:
        store = ListStore()
        cache = make_cache(SMALL, "1TB", "sglang+", store=store)
        cache.commit(_seq(0, 10), 10, states={10: "s10", 5: "s5"}, kv=_seq(0, 10))
        assert store.released_states == ["s5"]

    def test_required_states(self) -> None:
        cache = make_cache(SMALL, "1TB", "marconi")
        _request(cache, _seq(0, 30), [])
        assert cache.required_states([*_seq(0, 10), 99], 11) == (10, 11)
        assert cache.required_states(_seq(0, 30), 30) == ()


class TestBadInput:
    @pytest.mark.parametrize("tokens,word", [
        ([], "empty token list"), ([1.5, 2.0], "must be integers"), ([[1, 2]], "flat list"),
        (["a"], "must be integers"), ([-1, 3], r"\[0, 2\*\*31\)")])
    def test_tokens(self, tokens: object, word: str) -> None:
        cache = make_cache(SMALL, "1GB", "marconi")
        with pytest.raises(ValueError, match=word):
            cache.lookup(tokens)

    def test_negative_capacity(self) -> None:
        with pytest.raises(ValueError, match="-5"):
            make_cache(SMALL, -5, "marconi")

    def test_unknown_system(self) -> None:
        with pytest.raises(ValueError, match=r"unknown system .mru.*sglang"):
            make_cache(SMALL, "1GB", "mru")

    def test_negative_alpha(self) -> None:
        with pytest.raises(ValueError, match=r"-0\.5"):
            make_cache(SMALL, "1GB", "marconi", alpha=-0.5)

    def test_n_input_out_of_range(self) -> None:
        cache = make_cache(SMALL, "1GB", "marconi")
        with pytest.raises(ValueError, match="n_input=5"):
            cache.commit([1, 2], 5)


class TestTransformer:
    def test_every_matched_token_is_reused_without_ssm_layers(self) -> None:
        spec = SMALL.replace(ssm_layers=0, attention_layers=4)
        for system in ("sglang+", "vllm+", "marconi"):
            cache = make_cache(spec, "1TB", system)
            _request(cache, _seq(0, 100), [1, 2])
            assert cache.lookup([*_seq(0, 57), 999]).hit == 57


class TestEarlyStates:
    def test_chunk_boundary_state_stands_in_for_the_branch_point(self) -> None:
        store = ListStore()
        cache = make_cache(SMALL, "1TB", "marconi", store=store)
        system = _seq(0, 100)
        _request(cache, [*system, *_seq(1000, 20)], [])
        second = [*system, *_seq(2000, 20)]
        assert cache.lookup(second).checkpoints == (100,)
        # chunk-boundary capture (chunk 32) took the state at 96 instead of 100
        result = cache.commit(second, len(second), states={96: "s96", 120: "s120"},
                              kv=second)
        assert result.admitted == (96, 120) and store.released_states == []
        assert cache.lookup([*system, *_seq(3000, 20)]).hit == 96
        check_integrity(cache)

    def test_a_state_past_the_previous_position_only(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang+", store=ListStore())
        result = cache.commit(_seq(0, 50), 50, states={30: "early"}, kv=_seq(0, 50))
        assert result.admitted == (30,)
        assert cache.stats.states_not_captured == 0


class TestCommitResumesItsLookup:
    """A commit resumes the walk where its request's lookup ended, unless the tree changed
    shape in between (`RadixTree.version`): then it walks from the root."""

    @staticmethod
    def _shape(cache: PrefixCache) -> list[tuple[object, ...]]:
        return sorted((n.depth, n.key, n.has_state, len(n.children))
                      for n in cache.tree.nodes())

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm+", "marconi+"])
    def test_same_as_walking_from_the_root(self, system: str) -> None:
        """Between a lookup and its commit other commits split, extend, evict and merge
        edges on the looked-up path and open namespaces; every commit must leave the same
        tree as a twin that always walks from the root."""
        rng = np.random.default_rng(7)
        capacity = 60 * SMALL.kv_bytes_per_token * 32 + 6 * SMALL.ssm_bytes
        resumed, rooted = (make_cache(SMALL, capacity, system) for _ in range(2))
        bases = [rng.integers(0, 50, size=400) for _ in range(3)]
        resumed_at = 0
        for step in range(300):
            base = bases[int(rng.integers(3))]
            cut = int(rng.integers(1, len(base)))
            seq = np.concatenate([base[:cut], rng.integers(0, 50, size=int(rng.integers(1, 40)))])
            n_input = int(rng.integers(1, len(seq) + 1))
            salt = [None, "a"][int(rng.integers(2))]
            plans = [c.lookup(seq[:n_input], salt=salt) for c in (resumed, rooted)]
            assert plans[0].hit == plans[1].hit
            draw = rng.random()
            if draw < 0.1:  # a commit of another sequence than the one looked up
                seq = np.concatenate([[99], seq[1:]])
            elif draw < 0.2:  # or in another namespace
                salt = "a" if salt is None else None
            elif draw < 0.6:  # another request's commit lands in between
                other = bases[int(rng.integers(3))][: int(rng.integers(1, 400))]
                for c in (resumed, rooted):
                    c.commit(other, len(other), salt=[None, "a", "b"][step % 3])
            version = resumed.tree.version
            rooted._looked = None  # the twin walks from the root
            looked = resumed._looked
            for c in (resumed, rooted):
                c.commit(seq, n_input, salt=salt)
            resumed_at += looked is not None and looked[3] == version
            assert self._shape(resumed) == self._shape(rooted), f"step {step}"
            check_integrity(resumed)
        assert 50 < resumed_at < 300  # both paths ran


class TestClone:
    """`core.snapshot.clone`: a copy with its policies' books behaves as the original."""

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "marconi+-depth", "marconi+-gd"])
    def test_a_clone_goes_on_as_the_original(self, system: str) -> None:
        from marconi.core.snapshot import clone

        rng = np.random.default_rng(3)
        capacity = 40 * SMALL.kv_bytes_per_token * 32 + 6 * SMALL.ssm_bytes
        cache = make_cache(SMALL, capacity, system)
        bases = [rng.integers(0, 50, size=300) for _ in range(3)]

        def step(c: PrefixCache, seq: np.ndarray) -> int:
            hit = c.lookup(seq[:-5]).hit
            c.commit(seq, len(seq) - 5)
            return hit

        def seqs(n: int) -> list[np.ndarray]:
            return [np.concatenate([bases[int(rng.integers(3))][: int(rng.integers(10, 300))],
                                    rng.integers(0, 50, size=8)]) for _ in range(n)]

        for seq in seqs(60):
            step(cache, seq)
        copy_ = clone(cache)
        assert cache.stats.evictions > 0 and copy_.tree.root is not cache.tree.root
        later = seqs(120)
        assert [step(copy_, s) for s in later] == [step(cache, s) for s in later]
        assert (sorted((n.id, n.key, n.has_state) for n in copy_.tree.nodes())
                == sorted((n.id, n.key, n.has_state) for n in cache.tree.nodes()))
        assert copy_.stats == cache.stats
        check_integrity(copy_)
        check_integrity(cache)

    def test_a_deep_tree(self) -> None:
        """Deeper than the interpreter's recursion limit: copied without recursing."""
        import sys

        from marconi.core.snapshot import clone

        cache = make_cache(SMALL, "1TB", "sglang+")
        depth = sys.getrecursionlimit() + 500
        seq = np.arange(depth + 1) % 30000
        for n in range(1, depth + 1):  # each commit ends one token further: a node each
            cache.commit(seq[:n], n)
        copy_ = clone(cache)
        assert len(copy_.tree.nodes()) == len(cache.tree.nodes()) >= depth
        assert copy_.lookup(seq[: depth + 1]).hit == cache.lookup(seq[: depth + 1]).hit == depth


class TestServe:
    """`PrefixCache.serve(key, n_input, boundaries)`: a token-only request from checked
    bytes, the same as `lookup` of the input and `commit` of the whole."""

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm+", "marconi+"])
    def test_the_same_as_lookup_then_commit(self, system: str) -> None:
        rng = np.random.default_rng(11)
        capacity = 50 * SMALL.kv_bytes_per_token * 32 + 6 * SMALL.ssm_bytes
        served, called = (make_cache(SMALL, capacity, system) for _ in range(2))
        for c in (served, called):
            if hasattr(c.admission, "use_boundaries"):  # marconi+: checkpoint boundaries
                c.admission.use_boundaries(first=True, last=True)
        base = rng.integers(0, 50, size=500).astype(np.int32)
        for _ in range(150):
            seq = np.concatenate([base[: int(rng.integers(1, 500))],
                                  rng.integers(0, 50, size=int(rng.integers(1, 30)))])
            seq = seq.astype(np.int32)
            n_input = int(rng.integers(1, len(seq) + 1))
            cut = int(rng.integers(n_input // 2, n_input))  # past the hit, mostly
            boundaries = (cut,) if cut else ()
            hit = served.serve(seq.tobytes(), n_input, boundaries)
            assert hit == called.lookup(seq[:n_input], boundaries=boundaries).hit
            called.commit(seq, n_input, boundaries=boundaries)
            assert served.stats == called.stats and served.clock == called.clock
        assert served.stats.evictions > 0
        assert (sorted((n.id, n.key, n.has_state) for n in served.tree.nodes())
                == sorted((n.id, n.key, n.has_state) for n in called.tree.nodes()))
        check_integrity(served)

    @pytest.mark.parametrize(("key", "n_input"), [(b"\0" * 8, 0), (b"\0" * 8, 3),
                                                  (b"\0" * 7, 1), (b"", 1)])
    def test_bad_input_is_named(self, key: bytes, n_input: int) -> None:
        cache = make_cache(SMALL, "1GB", "sglang+")
        with pytest.raises(ValueError, match="serve: n_input"):
            cache.serve(key, n_input)
        assert cache.stats.commits == 0 and cache.clock == 0
