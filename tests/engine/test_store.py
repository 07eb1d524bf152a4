"""Byte accounting: tensors held == spec bytes, per node and in total; eviction frees them."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from tests.engine.test_paged import check_pools

from marconi.core.families import ENGINE_FAMILIES
from marconi.engines.hf import Engine, KVBlock, PagedStore, SSMState

FAMILIES = ENGINE_FAMILIES  # the registry's (core/families.py)


def _run(engine: Engine, seed: int, requests: int = 6) -> None:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 256, 40)
    for _ in range(requests):
        engine.generate(np.concatenate([system, rng.integers(0, 256, 15)]), 6)


def check_bytes(engine: Engine) -> None:
    """Every node's tensors match the spec; totals match the cache's and the store's (a
    paged store: pages and slots, tests/engine/test_paged.py)."""
    if isinstance(engine.store, PagedStore):
        check_pools(engine)
        return
    spec, kv_total, state_total = engine.model.spec, 0, 0
    for node in engine.cache.tree.nodes():
        if node is engine.cache.tree.root:
            continue
        assert isinstance(node.kv, KVBlock) and node.kv.tokens == node.edge_len
        assert node.kv.nbytes == node.edge_len * spec.kv_bytes_per_token
        kv_total += node.kv.nbytes
        if node.has_state:
            assert isinstance(node.state, SSMState) and node.state.position == node.depth
            assert node.state.nbytes == spec.ssm_bytes  # the model's spec: SSM layers only
            # the cache also counts the logits kept beside each state against its capacity
            held = node.state.nbytes + node.state.logits_bytes
            assert held == engine.cache.spec.ssm_bytes
            state_total += held
    stats, store = engine.cache.stats, engine.store
    assert (kv_total, state_total) == (stats.kv_bytes, stats.ssm_bytes)
    assert (kv_total, state_total) == (store.kv_bytes, store.state_bytes + store.logits_bytes)


class TestByteAccounting:
    @pytest.mark.parametrize("arch", FAMILIES)
    @pytest.mark.parametrize("system", ["marconi", "sglang+", "vllm+"])
    def test_tensors_equal_spec_per_node_and_in_total(self, get_model, arch, system):
        engine = Engine(get_model(arch), system, alpha=0.5 if system == "marconi" else None)
        _run(engine, seed=0)
        assert engine.cache.stats.states_admitted > 0
        check_bytes(engine)

    @pytest.mark.parametrize("system", ["marconi", "sglang+", "vllm+", "marconi+"])
    def test_bounded_capacity_evicts_and_stays_consistent(self, get_model, system):
        model = get_model("bamba")
        capacity = 5 * model.spec.ssm_bytes + 150 * model.spec.kv_bytes_per_token
        engine = Engine(model, system, capacity, alpha=0.5 if system == "marconi" else None)
        _run(engine, seed=1, requests=10)
        assert engine.cache.stats.evictions > 0
        assert engine.cache.bytes <= capacity
        check_bytes(engine)


class TestRelease:
    def test_eviction_frees_the_tensors(self, get_model):
        model = get_model("bamba")
        engine = Engine(model, "sglang+")
        _run(engine, seed=2, requests=3)
        refs = [weakref.ref(t) for node in engine.cache.tree.nodes()
                if isinstance(node.state, SSMState) for t in node.state.recurrent]
        refs += [weakref.ref(t) for node in engine.cache.tree.nodes()
                 if isinstance(node.kv, KVBlock) for t in node.kv.keys]
        engine.cache.evict(engine.cache.bytes)
        gc.collect()
        assert refs and all(r() is None for r in refs)
        assert engine.store.nbytes == 0 and engine.cache.bytes == 0
