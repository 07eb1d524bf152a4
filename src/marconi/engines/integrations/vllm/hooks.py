"""What the vLLM plugin hooks in vLLM: `install` replaces `kv_cache_coordinator.BlockPool`
with `pool.MarconiBlockPool` and wraps `KVCacheCoordinator.__init__` (its pool told which
groups hold Mamba states and given the integration's order) and `KVCacheManager.free`
(the KV past a request's last state noted as orphans, a finished request handed to the
tuner); `uninstall` puts vLLM's own back. `split_prefills_on_cpu` replaces the Mamba2
layers' state spec on vLLM's CPU platform. vLLM is imported when they run, not here."""

from __future__ import annotations

from typing import Any

from marconi.core.spec import ModelSpec
from marconi.engines.integrations.common import (
    Installed,
    Integration,
    IntegrationError,
    check_policy,
    check_untuned,
    declared_score,
)
from marconi.engines.integrations.vllm.costs import REPORT_EVERY, Clocks, now, report
from marconi.engines.integrations.vllm.handover import MIRROR, hand_over
from marconi.engines.integrations.vllm.order import DeclaredStates, StateOrder
from marconi.engines.integrations.vllm.versions import WHO, check_version, log

CPU_SPLIT = "MARCONI_VLLM_CPU_SPLIT"  # "1": no mid-prefill Mamba checkpoint (CPU only)

installed = Installed()  # what `install` put in, in this process


def install(spec: ModelSpec, *, policy: str = "marconi", alpha: float | None = None,
            background: bool = True, orphans_first: bool = True, process: bool = False
            ) -> Integration:
    """Put Marconi's eviction into vLLM (before its KV cache manager is built); `alpha`
    fixes it, else the bootstrap tuner sets it (`background`: in its own thread, or with
    `process` in a child process). `orphans_first=False` leaves cached KV past a
    request's last state in vLLM's order (an ablation: with alpha 0 the engine is then
    stock vLLM)."""
    check_policy(WHO, policy)
    check_version()
    from vllm.v1.core import kv_cache_coordinator as kcc
    from vllm.v1.core import kv_cache_manager as kcm

    from marconi.engines.integrations.vllm.pool import MarconiBlockPool

    uninstall()
    priority = check_untuned(WHO, policy, alpha)
    if priority is not None:  # a declared priority over the states, untuned
        order: StateOrder = DeclaredStates(spec, priority)
        done = Integration(policy=policy, order=order, tuning=None)
    else:
        order = StateOrder(spec, declared_score(MIRROR, spec), alpha or 0.0, orphans_first)
        done = Integration.of(policy, order, spec, alpha, background, process, log)
    stock_pool, stock_init = kcc.BlockPool, kcc.KVCacheCoordinator.__init__
    free = kcm.KVCacheManager.free
    kcc.BlockPool = MarconiBlockPool
    kcc.KVCacheCoordinator.__init__ = _coordinator_init(stock_init, done)
    kcm.KVCacheManager.free = _free(free, done)
    done.undo = [(kcc, "BlockPool", stock_pool),
                 (kcc.KVCacheCoordinator, "__init__", stock_init),
                 (kcm.KVCacheManager, "free", free)]
    return installed.put(done)


def uninstall() -> None:
    """Put vLLM's own classes back (tests, benchmarks running both)."""
    installed.uninstall()


_split_done = False


def split_prefills_on_cpu() -> None:
    """vLLM 0.32's Mamba2 layers ask for a mid-prefill state checkpoint that the CPU
    build's scan does not return (`conv_ssm_forward`: IndexError, then the engine dies on
    the first prompt longer than one block). On the CPU platform, declare the
    layers' state specs without it, as every other Mamba layer does: the scheduler then
    splits prefills at block boundaries instead, and the same states are cached. Other
    platforms are left alone (logged)."""
    global _split_done
    if _split_done:
        return
    check_version()
    from vllm.platforms import current_platform

    _split_done = True
    if not current_platform.is_cpu():
        log.info("marconi: %s=1 ignored: this is not vLLM's CPU platform", CPU_SPLIT)
        return
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    # MambaBase's spec: no checkpoint block, as the other Mamba layers declare it
    MambaMixer2.get_kv_cache_spec = MambaBase.get_kv_cache_spec
    log.info("marconi: vLLM's mid-prefill Mamba checkpoint is off (%s=1; its CPU scan cannot "
             "return it): prefills split at block boundaries", CPU_SPLIT)


def _coordinator_init(stock: Any, integration: Integration) -> Any:
    """`KVCacheCoordinator.__init__`, then the pool told which groups hold Mamba states
    and given the integration's order, counters and clocks."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    from marconi.engines.integrations.vllm.books import group_suffix

    assert isinstance(integration.order, StateOrder)
    order: StateOrder = integration.order
    counters = integration.counters
    clocks = Clocks(counters)

    def __init__(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        stock(self, kv_cache_config, *args, **kwargs)
        pool = self.block_pool
        if hasattr(pool, "marconi_states"):
            pool.marconi_order, pool.marconi_counters = order, counters
            pool.marconi_clocks = clocks
            groups = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                      if isinstance(g.kv_cache_spec, MambaSpec)]
            if not groups:
                raise IntegrationError(f"{WHO}: this model has no Mamba layers; Marconi's "
                                       "eviction orders Mamba states only")
            pool.marconi_states = dict.fromkeys(groups)
            pool.marconi_state_ends = {group_suffix(g): g for g in groups}
            pool.marconi_state_suffixes = [group_suffix(g) for g in groups]
            if len(kv_cache_config.kv_cache_groups) <= 256:  # a key's last byte: its group
                pool.marconi_state_of_byte = tuple(
                    i if i in groups else None for i in range(256))
            order.size(len(pool.blocks))
            pool.marconi_replacing = {}
            pool.marconi_orphans = {}
            pool.marconi_orphans_first = order.orphans_first
            pool.marconi_config = kv_cache_config
            pool.marconi_kv_groups = [
                (i, g.kv_cache_spec.block_size, group_suffix(i))
                for i, g in enumerate(kv_cache_config.kv_cache_groups)
                if isinstance(g.kv_cache_spec, AttentionSpec)]
            # each attention group's request -> blocks (its manager's own dict: a
            # finished request's blocks read without `get_blocks`' tuple over every group)
            pool.marconi_kv_blocks = [(self.single_type_managers[i].req_to_blocks, size)
                                      for i, size, _ in pool.marconi_kv_groups]

    return __init__


def _free(free: Any, integration: Integration) -> Any:
    """`KVCacheManager.free`, then a finished request to the tuner (a preempted one is
    freed too, and is not handed over)."""
    from marconi.engines.integrations.vllm.books import check_past, past_last_state

    clocks = Clocks(integration.counters)
    assert isinstance(integration.order, StateOrder)
    order: StateOrder = integration.order

    def marconi_free(self: Any, request: Any) -> None:
        pool, start = self.block_pool, now()
        past = past_last_state(pool, request) \
            if getattr(pool, "marconi_states", None) is not None and pool.marconi_orphans_first \
            else None
        clocks.past(now() - start)
        if order.check and getattr(pool, "marconi_states", None) is not None \
                and pool.marconi_orphans_first:
            check_past(pool, request, self.coordinator.get_blocks(request.request_id), past)
        free(self, request)
        if past:
            start, orphans = now(), pool.marconi_orphans
            for block in past:
                if block.ref_cnt == 0 and block.block_hash is not None:
                    orphans[block.block_id] = block
            clocks.past(now() - start)
        if not request.is_finished():
            return
        counters = integration.counters
        counters.requests += 1
        tuning = integration.tuning
        if tuning is not None:
            hand_over(tuning, counters, request, self.kv_cache_config)
        if counters.requests % REPORT_EVERY == 0:
            report(integration)

    return marconi_free
