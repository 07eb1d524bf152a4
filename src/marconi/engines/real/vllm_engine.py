"""vLLM 0.32, 0.33 or 0.34 imported (those versions only) and its cache built as vLLM builds it
for one worker: `KVCacheManager` over the groups and pool vLLM derives, and the scheduler's
settings that cut chunks (`Engine`), with what the meta reports of them.

The model is given by byte sizes; the worker builds `FullAttentionSpec` / `MambaSpec`
layers of those sizes, derives the attention block size as
`Platform._align_hybrid_block_size` does for CUDA FlashAttention, pads the Mamba page to
the attention page, and groups layers and sizes the pool with vLLM's `get_kv_cache_groups`
and `get_kv_cache_config_from_groups` (equal pages: `num_blocks = memory_bytes //
(page bytes * layers per group)`; block 0 is vLLM's null block, never used).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from marconi.engines.real.vllm_options import KERNEL_BLOCK, UsageError, check_retention

# the series this worker drives (0.33, 0.34 from their GPU wheels: no CPU build is published, and
# the cache classes are pure Python, run here on the CPU platform)
SUPPORTED_VERSIONS = ("0.32", "0.33", "0.34")
LAYER_ATTN = "model.layers.{}.self_attn.attn"
LAYER_MAMBA = "model.layers.{}.mixer"
KV_CACHE_LAYOUT = "LBNHC"  # vLLM's default when the backend declares no preference


def import_vllm() -> str:
    """Import vLLM quietly, on its CPU platform (a GPU wheel would find no device), and
    refuse any version but 0.32.x, 0.33.x and 0.34.x."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        import vllm
    except Exception as exc:  # any import failure means no usable engine
        raise UsageError(f"cannot import vllm ({type(exc).__name__}: {exc})") from None
    version = str(vllm.__version__)
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VERSIONS):
        raise UsageError(f"vllm {version} is not supported; this worker drives vllm "
                         f"{', '.join(v + '.x' for v in SUPPORTED_VERSIONS)}")
    return version


def torch_dtype(dtype_bytes: int) -> Any:
    import torch

    return {1: torch.float8_e4m3fn, 2: torch.float16, 4: torch.float32}[dtype_bytes]


def mamba_page_bytes(options: dict[str, Any]) -> int:
    return int(options["conv_state_bytes"]) + int(options["ssm_state_bytes"])


def resolve_block_size(options: dict[str, Any]) -> int:
    """Attention block size as `Platform._align_hybrid_block_size` picks it (platforms/
    interface.py): the smallest multiple of the kernel alignment `K = max(16, block_size)`
    whose attention page (one layer's KV of a block) holds one Mamba page, rounded up to
    the backends' common alignment (16); a `--block-size` already large enough is kept.
    Without one it starts from `CacheConfig.DEFAULT_BLOCK_SIZE` (16 in 0.32 and 0.33; 64
    in 0.34, which FlashAttention takes as its preferred size: `update_block_size_for_
    backend`), checked against the installed vLLM's by `check_default_block`."""
    start = int(options["block_size"] or options["default_block_size"])
    kernel = max(KERNEL_BLOCK, start)
    per_token = int(options["kv_layer_bytes_per_token"])
    needed = kernel * math.ceil(mamba_page_bytes(options) / (kernel * per_token))
    needed = KERNEL_BLOCK * math.ceil(needed / KERNEL_BLOCK)
    return max(start, needed)


def check_default_block(options: dict[str, Any]) -> None:
    """The parent sized its layout from the same default block size as this vLLM's."""
    from vllm.config import CacheConfig

    own = int(CacheConfig.DEFAULT_BLOCK_SIZE)
    if options["block_size"] is None and options["default_block_size"] != own:
        raise UsageError(f"option 'default_block_size': {options['default_block_size']}, "
                         f"but this vllm's CacheConfig.DEFAULT_BLOCK_SIZE is {own}")


def layer_specs(options: dict[str, Any], block_size: int) -> dict[str, Any]:
    """One spec per layer, as a model's `get_kv_cache_spec` reports them.

    Attention is one head of `kv_layer_bytes_per_token / (2 * dtype_bytes)` elements (K
    and V); a Mamba layer holds its conv and recurrent states as byte arrays (vLLM reads
    only their byte size), its page padded up to the attention page as
    `cache_config.mamba_page_size_padded` does. Attention layers sit mid-period,
    Jamba-style; the order only names the groups (it changes no figure).
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    d = options["dtype_bytes"]
    attn = FullAttentionSpec(block_size=block_size, num_kv_heads=1, dtype=torch_dtype(d),
                             head_size=options["kv_layer_bytes_per_token"] // (2 * d))
    states = [b for b in (options["conv_state_bytes"], options["ssm_state_bytes"]) if b]
    padded = attn.page_size_bytes if attn.page_size_bytes > sum(states) else None
    mamba = MambaSpec(block_size=block_size, shapes=tuple((b,) for b in states),
                      dtypes=(torch.uint8,) * len(states), page_size_padded=padded,
                      mamba_cache_mode=options["mamba_cache_mode"])
    n_attn = options["attention_layers"]
    n_layers = n_attn + options["ssm_layers"]
    attn_at = {(2 * k + 1) * n_layers // (2 * n_attn) for k in range(n_attn)}
    return {LAYER_ATTN.format(i) if i in attn_at else LAYER_MAMBA.format(i):
            attn if i in attn_at else mamba for i in range(n_layers)}


def vllm_config(options: dict[str, Any], block_size: int) -> Any:
    """A model-less VllmConfig carrying the cache and scheduler settings the cache reads."""
    from vllm.config import VllmConfig

    config = model_less_config(VllmConfig)
    cache = config.cache_config
    cache.block_size = block_size
    cache.enable_prefix_caching = True
    cache.mamba_cache_mode = options["mamba_cache_mode"]
    cache.mamba_block_size = block_size  # align mode: mamba_block_size = block_size
    cache.prefix_cache_retention_interval = options["retention_interval"]
    cache.kv_cache_layout = KV_CACHE_LAYOUT
    config.scheduler_config.max_num_batched_tokens = options["max_num_batched_tokens"]
    config.scheduler_config.long_prefill_token_threshold = 0
    return config


def model_less_config(make: Callable[[], Any]) -> Any:
    """`VllmConfig()` for a worker that models a CUDA server's cache on the CPU platform.

    vLLM 0.34's CPU platform refuses, while the config is built, an x86 host without
    triton-cpu (`CpuPlatform.check_and_update_config`: a CPU server's kernels need it).
    The cache classes run no kernel, and what that pass sets otherwise (the CPU server's
    block size, KV space, async scheduling) is either set again by `vllm_config` or not
    read by the replay; so from 0.34 on the pass is the platform interface's own (none)
    while this one config is built. 0.32 and 0.33 build it as before."""
    import vllm
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    if tuple(int(x) for x in str(vllm.__version__).split(".")[:2]) < (0, 34):
        return make()
    platform = type(current_platform)
    own = platform.__dict__.get("check_and_update_config")
    platform.check_and_update_config = Platform.__dict__["check_and_update_config"]
    try:
        return make()
    finally:
        if own is None:
            del platform.check_and_update_config
        else:
            platform.check_and_update_config = own


@dataclass
class Engine:
    """The cache objects and the scheduler settings that cut chunks."""

    manager: Any
    config: Any
    kv_cache_config: Any
    block_size: int
    scheduler_block_size: int
    hash_block_size: int
    max_model_len: int
    budget: int
    split: Callable[..., int]
    attention_groups: frozenset[int]
    mamba_groups: frozenset[int]
    running: list[Any] = field(default_factory=list)  # requests past admission (concurrent)


def build_kv_cache_config(options: dict[str, Any], config: Any, block_size: int) -> Any:
    """Groups and pool size exactly as `get_kv_cache_configs` does for one worker
    (its max_model_len admission check is left to the replay, which reports a request
    that does not fit)."""
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    try:  # 0.33 moved the grouping and the pool's sizing out of kv_cache_utils
        from vllm.v1.core.kv_cache_planning import (
            get_kv_cache_config_from_groups,
            get_kv_cache_groups,
        )
    except ImportError:  # 0.32
        from vllm.v1.core.kv_cache_utils import (
            get_kv_cache_config_from_groups,
            get_kv_cache_groups,
        )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    register_all_kvcache_specs(config)
    groups = get_kv_cache_groups(config, layer_specs(options, block_size))
    worker = get_kv_cache_config_from_groups(config, groups, options["memory_bytes"])
    return generate_scheduler_kv_cache_config([worker])


def build_engine(options: dict[str, Any], max_model_len: int) -> Engine:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    check_default_block(options)
    block_size = resolve_block_size(options)
    check_retention(options, block_size)
    config = vllm_config(options, block_size)
    kv_config = build_kv_cache_config(options, config, block_size)
    if kv_config.num_blocks < 2:
        raise UsageError(f"option 'memory_bytes': {options['memory_bytes']} bytes hold "
                         f"{kv_config.num_blocks} block(s); vLLM needs at least 2")
    sched_bs, hash_bs = resolve_hashing(kv_config, config)
    # Scheduler.__init__'s KVCacheManager, without EAGLE, connectors, events or stats.
    manager = KVCacheManager(
        kv_cache_config=kv_config, max_model_len=max_model_len,
        scheduler_block_size=sched_bs, hash_block_size=hash_bs,
        max_in_flight_tokens=options["max_num_batched_tokens"], enable_caching=True,
        watermark=config.scheduler_config.watermark)
    kinds = [type(g.kv_cache_spec) for g in kv_config.kv_cache_groups]
    return Engine(
        manager, config, kv_config, block_size, sched_bs, hash_bs, max_model_len,
        options["max_num_batched_tokens"], make_split(manager, config, sched_bs, hash_bs),
        frozenset(i for i, k in enumerate(kinds) if issubclass(k, FullAttentionSpec)),
        frozenset(i for i, k in enumerate(kinds) if issubclass(k, MambaSpec)))


def resolve_hashing(kv_config: Any, config: Any) -> tuple[int, int]:
    """`EngineCore._initialize_kv_caches`: scheduler block size, hash block size and the
    hit alignment, recorded on the config as the engine core records them."""
    from vllm.v1.core.kv_cache_utils import (
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_config, config)
    kv_config.hash_block_size = hash_bs
    kv_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_config, config, sched_bs, hash_bs)
    return sched_bs, hash_bs


def make_split(manager: Any, config: Any, sched_bs: int, hash_bs: int) -> Callable[..., int]:
    """vLLM's own `Scheduler._mamba_block_aligned_split`, bound to the attributes it
    reads, computed as `Scheduler.__init__` computes them (no EAGLE, no MTP)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import MambaSpec

    kv_config = manager.kv_cache_config
    mamba_specs = [g.kv_cache_spec for g in kv_config.kv_cache_groups
                   if isinstance(g.kv_cache_spec, MambaSpec)]
    partial_hit = (bool(mamba_specs) and hash_bs < sched_bs
                   and manager.coordinator.enable_partial_hash_hits)
    shim = SimpleNamespace(
        cache_config=config.cache_config, scheduler_config=config.scheduler_config,
        block_size=sched_bs, hash_block_size=hash_bs, use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,  # (0.33: tokens hashed past each block; none here)
        mamba_partial_cache_hit=partial_hit,
        mamba_shared_prefix_checkpoint=partial_hit and manager.mamba_shared_prefix_checkpoint,
        mamba_prefill_checkpoint_alignment=next(
            (s.prefill_checkpoint_alignment for s in mamba_specs), None),
        mamba_has_prefill_checkpoint_blocks=bool(mamba_specs) and all(
            s.num_prefill_checkpoint_blocks > 0 for s in mamba_specs),
        max_num_scheduled_tokens=config.scheduler_config.max_num_batched_tokens)
    if config.cache_config.mamba_cache_mode != "align":
        return lambda request, n, *rest: n
    return lambda request, n, *rest: Scheduler._mamba_block_aligned_split(shim, request, n,
                                                                          *rest)


def engine_meta(engine: Engine) -> dict[str, Any]:
    groups = engine.kv_cache_config.kv_cache_groups
    page = groups[0].kv_cache_spec.page_size_bytes
    return {
        "block_size": engine.block_size,
        "num_blocks": engine.kv_cache_config.num_blocks,
        "usable_blocks": engine.kv_cache_config.num_blocks - 1,  # block 0 is the null block
        "blocks_per_state": len(engine.mamba_groups),
        "page_bytes": page,
        "block_bytes": page * len(groups[0].layer_names),
        "kv_cache_groups": [f"{type(g.kv_cache_spec).__name__} x{len(g.layer_names)}"
                            for g in groups],
        "scheduler_block_size": engine.scheduler_block_size,
        "hash_block_size": engine.hash_block_size,
        "max_model_len": engine.max_model_len,
        "scheduler_reserve_full_isl": engine.config.scheduler_config.scheduler_reserve_full_isl,
    }
