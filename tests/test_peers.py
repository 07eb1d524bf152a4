"""Today's engines as peers: SGLang's MambaRadixCache and vLLM's align mode."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.priority import Lists, ListVictim, TailSafe
from marconi.core.spec import PAPER_7B
from marconi.peers.mamba_align import (
    Align,
    BlockLRU,
    VLLMConfig,
    vllm_block_tokens,
    vllm_memory,
)
from marconi.peers.mamba_radix import BufferMode, MambaRadix, MambaRadixLRU, SGLangConfig
from marconi.sim import SimConfig, simulate
from marconi.systems import SYSTEMS, get_system, make_cache
from marconi.workload import load_trace
from tests.helpers import SMALL, ListStore, examples
from tests.test_cache_properties import inputs, outputs, reference_hit, state_prefixes

KV = SMALL.kv_bytes_per_token  # 256


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _request(cache: PrefixCache, inp: list[int], out: list[int] | None = None) -> int:
    plan = cache.lookup(inp)
    cache.commit(inp + (out or []), len(inp))
    return plan.hit


def _sglang(capacity: int | str = "1TB", **config: object) -> PrefixCache:
    cfg = SGLangConfig(**config)  # type: ignore[arg-type]
    return PrefixCache(SMALL, capacity, MambaRadix(cfg), MambaRadixLRU(cfg))


def _vllm(block: int, capacity: int | str = "1TB", chunk: int = 8192,
          retention: int | None = 0) -> PrefixCache:
    cfg = VLLMConfig(block=block, chunk=chunk, retention=retention)
    return PrefixCache(SMALL, capacity, Align(cfg), BlockLRU())


class TestRegistry:
    @pytest.mark.parametrize("name", ["sglang-2026", "sglang-2026-extra", "vllm-2026"])
    def test_registered(self, name: str) -> None:
        assert name in SYSTEMS and SYSTEMS[name].description

    def test_bad_configs(self) -> None:
        with pytest.raises(ValueError, match="chunk"):
            SGLangConfig(chunk=0)
        with pytest.raises(ValueError, match="state_share"):
            SGLangConfig(state_share=1.5)
        with pytest.raises(ValueError, match="block"):
            VLLMConfig(block=-16)


class TestVLLMAlign:
    def test_block_derived_from_spec_as_vllm_does(self) -> None:
        # 16 * ceil(one layer's state / (16 * one layer's KV per token))
        assert vllm_block_tokens(SMALL) == 48  # 10,240 B state, 256 B/token
        assert vllm_block_tokens(PAPER_7B) == 80
        assert make_cache(SMALL, "1TB", "vllm-2026").admission.block == 48  # type: ignore

    def test_block_derived_from_64_as_vllm_0_34_does(self) -> None:
        """vLLM 0.34 starts from a default block size of 64 (0.32: 16): the smallest
        multiple of 64 whose page holds a state, 128 tokens for paper-7b (80 from 16);
        the emulation follows it with `default_block_size=64`, and refuses another base."""
        assert vllm_block_tokens(PAPER_7B, 64) == 128
        assert vllm_block_tokens(SMALL, 64) == 64  # 48 needed: the base itself
        assert vllm_block_tokens(PAPER_7B, 16) == vllm_block_tokens(PAPER_7B) == 80
        cache = make_cache(SMALL, "1TB", "vllm-2026:default_block_size=64")
        assert cache.admission.block == 64  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="base must be one of"):
            VLLMConfig(base=32)
        with pytest.raises(ValueError, match=r"default_block_size='32' is not allowed "
                                             r"\(allowed: 16, 64\)"):
            make_cache(SMALL, "1TB", "vllm-2026:default_block_size=32")

    def test_no_hit_below_one_block(self) -> None:
        cache = make_cache(SMALL, "1TB", "vllm-2026")
        _request(cache, _seq(0, 48), [1])  # the replay boundary is (48 - 1) // 48 * 48 = 0
        assert cache.lookup(_seq(0, 49)).hit == 0 and cache.stats.states == 0
        _request(cache, _seq(0, 49))  # its replay boundary: 48
        assert cache.lookup(_seq(0, 48)).hit == 0  # a hit leaves one token to compute
        assert cache.lookup([*_seq(0, 48), 9]).hit == 48

    def test_hit_is_block_aligned_and_below_input(self) -> None:
        cache = _vllm(block=16)
        _request(cache, _seq(0, 100))
        assert cache.stats.kv_bytes == 96 * KV  # the partial tail block is not cached
        assert cache.lookup(_seq(0, 100)).hit == 96
        assert cache.lookup(_seq(0, 96)).hit == 0  # the only state is at 96: hit <= 95

    def test_default_retention_keeps_replay_boundary_and_every_full_block(self) -> None:
        cache = _vllm(block=16)
        _request(cache, _seq(0, 40), _seq(500, 30))  # 69 tokens computed, 64 in full blocks
        held = sorted(n.depth for n in cache.tree.nodes() if n.has_state)
        assert held == [32] and cache.stats.kv_bytes == 64 * KV
        assert cache.lookup(_seq(0, 40) + _seq(500, 30)).hit == 32

    def test_dense_retention_holds_output_block_boundaries(self) -> None:
        cache = _vllm(block=16, retention=None)
        _request(cache, _seq(0, 40), _seq(500, 30))  # the last sampled token is never fed
        held = sorted(n.depth for n in cache.tree.nodes() if n.has_state)
        assert held == [32, 48, 64] and cache.lookup(_seq(0, 40) + _seq(500, 30)).hit == 64
        _request(cache, _seq(0, 40), _seq(900, 24))  # 64 = n_total: computed 63, no state
        assert cache.lookup(_seq(0, 40) + _seq(900, 24) + [1]).hit == 48

    def test_retention_interval_keeps_one_state_per_interval(self) -> None:
        cache = _vllm(block=16, retention=32)
        _request(cache, _seq(0, 50), _seq(500, 60))
        held = sorted(n.depth for n in cache.tree.nodes() if n.has_state)
        assert held == [32, 48, 64, 96]  # 48: the replay boundary
        with pytest.raises(ValueError, match="multiple of the block"):
            VLLMConfig(block=16, retention=40)

    def test_running_request_needs_room_for_all_it_computed(self) -> None:
        block = vllm_block_tokens(SMALL)  # 48 tokens
        spec, capacity = vllm_memory(SMALL, 10**9, VLLMConfig(block=block))
        assert spec.ssm_bytes == 8 * block * KV  # 8 layers, each a whole 48-token page
        assert capacity == (10**9 // (block * KV) - 1) * block * KV  # less the null block
        assert Align(VLLMConfig(block=block)).running(100) == (99, 2)

    def test_shared_prefix_junction_checkpointed(self) -> None:
        cache = _vllm(block=16)
        system = _seq(0, 100)
        _request(cache, system + _seq(1000, 50))
        plan = cache.lookup(system + _seq(2000, 50))
        assert plan.hit == 0 and plan.checkpoints == (96, 144)
        cache.commit(system + _seq(2000, 50), 150)
        assert cache.lookup(system + _seq(3000, 50)).hit == 96

    def test_chunk_ends_block_aligned(self) -> None:
        cache = _vllm(block=16, chunk=40, retention=None)  # steps of 32 tokens
        assert cache.lookup(_seq(0, 100)).checkpoints == (32, 64, 96)
        assert _vllm(block=16, chunk=40).lookup(_seq(0, 100)).checkpoints == (96,)

    def test_state_leaves_alone_kv_stays(self) -> None:
        cache = _vllm(block=16)
        _request(cache, _seq(0, 33))
        _request(cache, _seq(100, 33))
        assert cache.lookup([*_seq(0, 32), 7]).hit == 32  # refreshes the first one
        kv = cache.stats.kv_bytes
        cache.evict(1)
        assert cache.stats.kv_bytes == kv and cache.stats.states_evicted == 1
        assert cache.lookup([*_seq(100, 32), 7]).hit == 0
        assert cache.lookup([*_seq(0, 32), 7]).hit == 32
        check_integrity(cache)


class TestSGLangNoBuffer:
    def test_chunk_ends_input_end_and_request_end(self) -> None:
        cache = _sglang(chunk=16)
        assert cache.lookup(_seq(0, 40)).checkpoints == (16, 32, 40)
        result = cache.commit([*_seq(0, 40), 1, 2, 3], 40)
        assert result.admitted == (16, 32, 40, 42)  # the last sampled token is never fed
        assert cache.lookup([*_seq(0, 40), 1, 2]).hit == 40  # a hit leaves one to compute
        assert cache.lookup([*_seq(0, 40), 1, 2, 3]).hit == 42

    def test_default_chunk_is_8192(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang-2026")
        assert cache.lookup(_seq(0, 20_000)).checkpoints == (8192, 16384, 20000)

    def test_chunks_start_at_the_hit(self) -> None:
        cache = _sglang(chunk=16)
        _request(cache, _seq(0, 10))
        assert cache.lookup(_seq(0, 40)).checkpoints == (26, 40)

    def test_no_state_at_a_new_branch(self) -> None:
        cache = _sglang()
        _request(cache, _seq(0, 100) + _seq(1000, 20))
        plan = cache.lookup(_seq(0, 100) + _seq(2000, 20))
        assert plan.checkpoints == (120,)  # no-buffer mode tracks no branch point

    def test_tombstone_keeps_kv_and_state_readmitted(self) -> None:
        cache = _sglang(state_share=0.0)  # states always over their share: mamba list first
        shared = _seq(0, 100)
        _request(cache, shared + _seq(1000, 20))
        _request(cache, shared + _seq(2000, 20))  # splits at 100: a node without state
        assert cache.commit(shared, 100).admitted == (100,)  # re-admitted, no new KV
        cache.lookup(shared + _seq(1000, 20) + [7])  # refreshes that leaf and its ancestors
        cache.lookup(shared + _seq(2000, 20) + [7])
        cache.evict(1)  # oldest state: a leaf, which leaves whole
        cache.evict(1)  # then the state at 100 (ancestors before children on ties)
        node = cache.tree.match(_bytes(shared)).node
        assert node is not None and not node.has_state and node.children  # a tombstone
        assert cache.lookup([*shared, 5]).hit == 0 and cache.lookup([*shared, 5]).matched == 100
        assert cache.commit(shared, 100).admitted == (100,)
        assert cache.lookup([*shared, 5]).hit == 100
        check_integrity(cache)

    def test_tombstone_leaf_removed(self) -> None:
        cache = _sglang(state_share=0.0)
        shared = _seq(0, 100)
        _request(cache, shared + _seq(1000, 20))
        _request(cache, shared + _seq(2000, 20))
        cache.evict(1)
        cache.evict(1)  # the last leaf leaves: the stateless node at 100 goes with it
        assert cache.tree.size == 0 and cache.bytes == 0
        check_integrity(cache)

    def test_states_per_path_cap(self) -> None:
        cache = _sglang(chunk=16, max_states_per_path=1)
        _request(cache, _seq(0, 40))
        assert [n.depth for n in cache.tree.nodes() if n.has_state] == [40]


class TestSGLangExtraBuffer:
    def test_branch_point_rounded_down_to_64(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang-2026-extra")
        _request(cache, _seq(0, 150) + _seq(1000, 50))  # tracked at 192: kept up to it
        assert cache.stats.kv_bytes == 192 * KV
        plan = cache.lookup(_seq(0, 150) + _seq(2000, 150))
        assert plan.checkpoints == (128,)  # forced track replaces the chunk's own (256)
        cache.commit(_seq(0, 150) + _seq(2000, 150), 300)
        assert cache.lookup(_seq(0, 150) + _seq(3000, 10)).hit == 128

    def test_short_request_not_cached(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang-2026-extra")
        _request(cache, _seq(0, 50), [1, 2])
        assert cache.bytes == 0 and cache.lookup(_seq(0, 50)).hit == 0

    def test_decode_tracked_every_256(self) -> None:
        cache = make_cache(SMALL, "1TB", "sglang-2026-extra")
        result = cache.commit(_seq(0, 200) + _seq(1000, 100), 200)
        assert result.admitted == (192, 256) and cache.stats.kv_bytes == 256 * KV


def _bytes(tokens: list[int]) -> bytes:
    import numpy as np

    return np.asarray(tokens, dtype=np.int32).tobytes()


PEERS = {
    "sglang": lambda cap: _sglang(cap, chunk=8),
    "sglang-extra": lambda cap: _sglang(cap, chunk=8, track=4, decode_interval=4,
                                        mode=BufferMode.EXTRA_BUFFER, max_states_per_path=3),
    "vllm": lambda cap: _vllm(4, cap, chunk=8),
}


@settings(max_examples=examples(80), deadline=None)
@given(st.sampled_from(sorted(PEERS)), st.integers(0, 300_000),
       st.lists(st.tuples(inputs, outputs), min_size=1, max_size=25))
def test_small_blocks_against_reference(peer: str, capacity: int, requests: list) -> None:
    """Small blocks and chunks, under pressure: hits match a brute force, invariants hold."""
    cache = PEERS[peer](capacity)
    cache.store = ListStore()
    for inp, out in requests:
        limit = cache.admission.max_hit(len(inp))
        plan = cache.lookup(inp)
        assert plan.hit == reference_hit(state_prefixes(cache), inp, limit)
        states = {p: ("state", p) for p in cache.required_states(inp + out, len(inp))}
        cache.commit(inp + out, len(inp), states=states, kv=inp + out)
        check_integrity(cache)


class TestSGLangWithMarconi:
    """`sglang-2026+marconi`: SGLang's two lists, Marconi's order for the states."""

    def test_alpha_zero_is_sglang_2026(self) -> None:
        trace = load_trace("synthetic:multi-turn:sessions=12")
        runs = [simulate(trace, SimConfig(spec=PAPER_7B, capacity="600MB", system=name,
                                          alpha=alpha, bounds=False))
                for name, alpha in (("sglang-2026", None), ("sglang-2026+marconi", 0.0))]
        assert runs[0].stats.evictions > 0
        assert (runs[0].records.hit == runs[1].records.hit).all()

    def test_the_state_victim_is_the_least_efficient(self) -> None:
        """A long prompt's state, then a short one's: the short one leaves first (its
        prefill is cheap per byte), where LRU would drop the older, long one."""
        spec = PAPER_7B
        slots = 2  # two states and the running request's: the third evicts one
        cache = get_system("sglang-2026+marconi").cache(
            spec, 10**12, alpha=2.0, state_slots=slots)
        long_prompt, short_prompt = _seq(1, 4000), _seq(100_000, 40)
        _request(cache, long_prompt)
        _request(cache, short_prompt)
        _request(cache, _seq(200_000, 40))  # a third state: one of the first two leaves
        assert cache.lookup([*long_prompt, 7]).hit > 0
        assert cache.lookup([*short_prompt, 7]).hit == 0


def _engine_hits(system: str, trace: str, capacity: str, core: str,
                 monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The hit per request of `system`, served, over `trace` at `capacity` on `core`."""
    from marconi.core import compiled
    from marconi.workload import TraceOptions

    monkeypatch.setenv(compiled.CORE_ENV, core)
    sessions = 12 if trace == "synthetic:agent" else 48
    requests = load_trace(trace, options=TraceOptions(sessions=sessions, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       replay="serving")
    result = simulate(requests, config)
    assert result.summary().to_json()["evictions"] > 0  # the capacity binds
    return [int(h) for h in result.records.hit]


# (the system, a trace and capacity where the change shows, its lists' class, the
# declaration changed); SGLang's states short of room (a small share of the memory), so
# that its state list gives victims, for the garbage
LISTS_CHANGED = [
    ("vllm-2026", "synthetic:agent", "5GB", BlockLRU, {"shallow_first": True}),
    ("sglang-2026", "synthetic:multi-turn", "1GB", MambaRadixLRU,
     {"victim": ListVictim.OLDER_HEAD}),
    ("sglang-2026:mamba_full_memory_ratio=0.05", "synthetic:agent", "1GB", MambaRadixLRU,
     {"garbage": False}),
    ("sglang-2026", "synthetic:agent", "5GB", MambaRadixLRU,
     {"tail_safe": TailSafe(threshold=2000, next_prompt=200)})]


@pytest.mark.parametrize(("system", "trace", "capacity", "lists", "change"), LISTS_CHANGED,
                         ids=["vllm-ties", "sglang-victim", "sglang-garbage", "sglang-tail"])
def test_changing_an_engines_declared_lists_is_one_change_on_both_cores(
        system: str, trace: str, capacity: str, lists: type, change: dict[str, object],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines' two lists are declared (`core.priority.Lists`: `BLOCK_QUEUE`,
    `SGLANG_LISTS`) and both cores evaluate the declaration: a changed one replays hit
    for hit on both, and differently."""
    from dataclasses import replace

    from marconi.core import compiled

    cores = [c for c in compiled.CORES if c == "python" or compiled.built()]
    before = {core: _engine_hits(system, trace, capacity, core, monkeypatch) for core in cores}
    monkeypatch.setattr(lists, "LISTS", replace(lists.LISTS, **change))  # type: ignore[attr-defined]
    after = {core: _engine_hits(system, trace, capacity, core, monkeypatch) for core in cores}
    for core in cores:
        assert before[core] == before["python"]
        assert after[core] == after["python"]
    assert after["python"] != before["python"]
    assert sum(after["python"]) > 0


@pytest.mark.parametrize("garbage", [True, False])
def test_a_leafs_state_leaves_with_its_leaf_only_where_stateless_leaves_are_garbage(
        garbage: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for one request, states over their share (none of the budget): the state
    list gives the victim, the first request's state at a leaf. Under SGLang's lists the
    leaf leaves with it; declared without garbage, the leaf stays with its KV. The same
    on both cores."""
    from dataclasses import replace

    from marconi.core import compiled

    monkeypatch.setattr(MambaRadixLRU, "LISTS", replace(MambaRadixLRU.LISTS, garbage=garbage))
    cores = [c for c in compiled.CORES if c == "python" or compiled.built()]
    kv = {}
    for core in cores:
        monkeypatch.setenv(compiled.CORE_ENV, core)
        cfg = SGLangConfig(state_share=0.0)
        cache = compiled.replay_cache(SMALL, 150_000, MambaRadix(cfg), MambaRadixLRU(cfg))
        assert getattr(cache, "compiled", False) == (core == "compiled")
        _request(cache, _seq(0, 40))
        _request(cache, _seq(1000, 40))
        assert cache.stats.evictions >= 1
        kv[core] = cache.stats.kv_bytes
    first = 40 * KV  # the first request's KV: a leaf of 40 tokens (one state fits)
    assert all(v == kv["python"] for v in kv.values())
    assert kv["python"] == (40 * KV if garbage else 40 * KV + first)


def test_a_tel_safe_kv_order_needs_the_victim_by_pool() -> None:
    with pytest.raises(ValueError, match=r"lists 'queue': a TEL-safe KV order \(tail_safe\) "
                                         r"needs the victim by pool"):
        Lists("queue", victim=ListVictim.OLDER_HEAD, shallow_first=False, garbage=False,
              tail_safe=TailSafe(threshold=10, next_prompt=0))
    with pytest.raises(ValueError, match="threshold >= 0"):
        TailSafe(threshold=-1, next_prompt=0)
