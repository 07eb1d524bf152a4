"""Replay a request trace through vLLM 0.32's real prefix cache (hybrid attention + Mamba).

Drives vLLM's own `KVCacheManager` (its `HybridKVCacheCoordinator`, `BlockPool`,
`FullAttentionManager` and `MambaManager` in `mamba_cache_mode="align"`), not an emulation,
so that `marconi.peers.mamba_align` can be checked against the real thing. No model runs:
the worker plays the scheduler's part around the cache, one request at a time, as
`vllm/v1/core/sched/scheduler.py` does for a lone request with synchronous scheduling
(the GPU default, async scheduling, ends with the same blocks cached:
`AsyncScheduler._update_request_with_output` caches each token once it is known):

1. each scheduler step starts with `KVCacheManager.new_step_starts()`;
2. admission: `get_computed_blocks` (its hit is what we report), then prefill chunks of
   at most `max_num_batched_tokens` tokens, each cut by vLLM's own
   `Scheduler._mamba_block_aligned_split`, each given slots by `allocate_slots`;
3. decode: after the chunk that ends the prompt the model "samples" the trace's next
   output token (`append_output_token_ids`, which extends the block hashes) and each
   later step feeds one token; the last sampled token is never fed, so the sequence
   processed is `n_input + n_output - 1` tokens; vLLM's `check_stop` ends the request;
4. `free`: the blocks go back to the pool tail first, keeping their hashes.

The model is given by byte sizes; the worker builds `FullAttentionSpec` / `MambaSpec`
layers of those sizes, derives the attention block size as
`Platform._align_hybrid_block_size` does for CUDA FlashAttention, pads the Mamba page to
the attention page, and groups layers and sizes the pool with vLLM's `get_kv_cache_groups`
and `get_kv_cache_config_from_groups` (equal pages: `num_blocks = memory_bytes //
(page bytes * layers per group)`; block 0 is vLLM's null block, never used).

Which states vLLM 0.32 keeps is `retention_interval` (`--prefix-cache-retention-interval`,
reaching the coordinator through `KVCacheConfig.prefix_cache_retention_interval`): 0, the
default, keeps only the prompt's replay boundary (`num_prompt_tokens - 1` rounded down to
a block) and shared-prefix junctions; a multiple of the block size adds one state per
interval; null keeps every state (each chunk end and each block boundary of decode).

Usage (in a virtualenv holding vllm 0.32, torch and numpy; marconi is not needed)::

    python vllm_worker.py --trace TRACE.npz --options OPTIONS.json --out DIR

TRACE.npz: `tokens` int32 (every request's input then output), `offsets` int64 (n+1),
`n_input` int64 (n), `arrival` float64 (n; requests are replayed in this order).
OPTIONS.json: see `OPTION_RULES`. DIR receives `result.npz` (per request, after it:
`hit` tokens served, `kv_blocks` / `state_blocks` attention / Mamba blocks holding a
hash; cumulative `evictions` of hashed blocks reused, split as `evicted_kv` and
`evicted_states` (Mamba blocks evicted / blocks per state); `micros` spent in vLLM
calls, block hashing of the request's tokens included) and `meta.json`.

Exit status: 0 done; 2 bad options or trace, unsupported vLLM, or a request that does
not fit the pool (nothing written); 1 any other error. Errors end stderr with one
`error: ...` line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from arrivals import NoRoom, Parent, run_concurrent  # beside this script
from engine_flags import VLLM_CACHE_MODES, VLLM_DEFAULTS  # beside this script: the systems' flags

SUPPORTED_VERSION = "0.32"
LAYER_ATTN = "model.layers.{}.self_attn.attn"
LAYER_MAMBA = "model.layers.{}.mixer"
# FlashAttention's kernel block constraint (`get_supported_kernel_block_sizes`:
# MultipleOf(16)) and CacheConfig.DEFAULT_BLOCK_SIZE: both 16 on CUDA.
KERNEL_BLOCK = 16
KV_CACHE_LAYOUT = "LBNHC"  # vLLM's default when the backend declares no preference


class UsageError(Exception):
    """Bad options or trace, unsupported vLLM, or a pool too small: exit 2."""


# --- options -----------------------------------------------------------------------------

_REQUIRED = object()


def _int_rule(low: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


@dataclass(frozen=True)
class Rule:
    default: object
    check: Callable[[object], bool]
    allowed: str  # shown in the error message


OPTION_RULES: dict[str, Rule] = {
    "attention_layers": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "kv_layer_bytes_per_token": Rule(
        _REQUIRED, _int_rule(1), "an integer >= 1, a multiple of 2 * dtype_bytes"),
    "ssm_layers": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "conv_state_bytes": Rule(_REQUIRED, _int_rule(0), "an integer >= 0"),
    "ssm_state_bytes": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "dtype_bytes": Rule(2, lambda v: _int_rule(1)(v) and v in (1, 2, 4), "1, 2 or 4"),
    "memory_bytes": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "block_size": Rule(
        VLLM_DEFAULTS["block_size"], lambda v: v is None or (isinstance(v, int) and _int_rule(16)(v)
                                      and v % KERNEL_BLOCK == 0),
        "null or a positive multiple of 16"),
    # vLLM 0.32 knows "align" and "none"; "none" disables Mamba prefix caching, and with
    # prefix caching on MambaModelConfig turns it into "align". There is no "all" mode.
    "mamba_cache_mode": Rule(VLLM_DEFAULTS["mamba_cache_mode"],
                             lambda v: v in VLLM_CACHE_MODES, '"align" (vLLM 0.32 has no "all")'),
    # --prefix-cache-retention-interval; null is vLLM's None (every state kept).
    "retention_interval": Rule(
        VLLM_DEFAULTS["retention_interval"], lambda v: v is None or _int_rule(0)(v),
        "null or an integer >= 0 (0 or a multiple of the block size)"),
    "max_num_batched_tokens": Rule(VLLM_DEFAULTS["max_num_batched_tokens"], _int_rule(1),
                                   "an integer >= 1"),
    "check": Rule(False, lambda v: isinstance(v, bool), "true or false"),
    # requests overlap as they arrive (arrivals.py): each runs TTFT (from the parent, on
    # stdin) + decode_s_per_token x n_output; false: one at a time, in arrival order
    "concurrent": Rule(False, lambda v: isinstance(v, bool), "true or false"),
    "decode_s_per_token": Rule(
        0.02, lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "a number >= 0"),
    "progress_every": Rule(0, _int_rule(0), "an integer >= 0 (0: only at the end)"),
    # marconi's eviction inside this vLLM (marconi.integrations.vllm, imported from `src`
    # only when asked): null, or {policy, spec, alpha, background, src}
    "integration": Rule(None, lambda v: v is None or _integration_rule(v),
                        "null or an object with exactly alpha, background, orphans_first, "
                        "policy, spec (an object) and src (a folder)"),
}

INTEGRATION_KEYS = ("alpha", "background", "orphans_first", "policy", "spec", "src")


def _integration_rule(value: object) -> bool:
    return (isinstance(value, dict) and sorted(value) == list(INTEGRATION_KEYS)
            and isinstance(value["spec"], dict) and isinstance(value["src"], str))


def install_integration(options: dict[str, Any]) -> Any:
    """marconi's integration, installed before the cache is built; None without one."""
    import importlib

    wanted = options["integration"]
    if wanted is None:
        return None
    sys.path.insert(0, wanted["src"])
    common = importlib.import_module("marconi.integrations.common")
    try:
        return common.install_from("vllm", wanted)
    except common.IntegrationError as err:
        raise UsageError(str(err)) from None


def load_options(path: Path) -> dict[str, Any]:
    """Options with defaults filled in; every key and value checked."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"options {path}: cannot read JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"options {path}: expected a JSON object")
    for key in raw:
        if key not in OPTION_RULES:
            raise UsageError(f"option {key!r} is unknown; allowed: {', '.join(OPTION_RULES)}")
    options: dict[str, Any] = {}
    for key, rule in OPTION_RULES.items():
        if key not in raw and rule.default is _REQUIRED:
            raise UsageError(f"option {key!r} is required: {rule.allowed}")
        value = raw.get(key, rule.default)
        if not rule.check(value):
            raise UsageError(f"option {key!r}: expected {rule.allowed}, got {value!r}")
        options[key] = value
    _check_divisible(options)
    return options


def _check_divisible(options: dict[str, Any]) -> None:
    """A token's K and V must be whole elements of `dtype_bytes` (the head size)."""
    d, key = options["dtype_bytes"], "kv_layer_bytes_per_token"
    if options[key] % (2 * d):
        raise UsageError(f"option {key!r}: expected {OPTION_RULES[key].allowed}, "
                         f"got {options[key]!r} with dtype_bytes={d}")


# --- trace -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    tokens: np.ndarray
    offsets: np.ndarray
    n_input: np.ndarray
    order: np.ndarray  # request indices in arrival order
    arrival: np.ndarray

    def __len__(self) -> int:
        return len(self.n_input)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def load_trace(path: Path) -> Trace:
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in ("tokens", "offsets", "n_input", "arrival")}
    except (OSError, KeyError, ValueError) as exc:
        raise UsageError(f"trace {path}: cannot read its arrays ({exc})") from None
    offsets, n_input = arrays["offsets"].astype(np.int64), arrays["n_input"].astype(np.int64)
    n = len(n_input)
    lengths = np.diff(offsets)
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(arrays["tokens"]):
        raise UsageError(f"trace {path}: offsets must be n+1 long, from 0 to len(tokens)")
    if len(arrays["arrival"]) != n or np.any(n_input < 1) or np.any(lengths < n_input):
        raise UsageError(f"trace {path}: need 1 <= n_input[i] <= request length, n arrivals")
    order = np.argsort(arrays["arrival"], kind="stable")  # ties keep trace order
    return Trace(arrays["tokens"].astype(np.int64), offsets, n_input, order,
                 arrays["arrival"].astype(np.float64))


# --- vLLM setup --------------------------------------------------------------------------


def import_vllm() -> str:
    """Import vLLM quietly and refuse any version but 0.32."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except Exception as exc:  # any import failure means no usable engine
        raise UsageError(f"cannot import vllm ({type(exc).__name__}: {exc})") from None
    version = str(vllm.__version__)
    if version != SUPPORTED_VERSION and not version.startswith(SUPPORTED_VERSION + "."):
        raise UsageError(f"vllm {version} is not supported; this worker drives vllm "
                         f"{SUPPORTED_VERSION}.x")
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
    the backends' common alignment (16); a `--block-size` already large enough is kept."""
    start = int(options["block_size"] or KERNEL_BLOCK)
    kernel = max(KERNEL_BLOCK, start)
    per_token = int(options["kv_layer_bytes_per_token"])
    needed = kernel * math.ceil(mamba_page_bytes(options) / (kernel * per_token))
    needed = KERNEL_BLOCK * math.ceil(needed / KERNEL_BLOCK)
    return max(start, needed)


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

    config = VllmConfig()
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
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
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

    block_size = resolve_block_size(options)
    _check_retention(options, block_size)
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


def _check_retention(options: dict[str, Any], block_size: int) -> None:
    """The coordinator's rule (`_validate_prefix_cache_retention_interval`), said early."""
    interval = options["retention_interval"]
    if interval and interval % block_size:
        raise UsageError(f"option 'retention_interval': expected null, 0 or a multiple of "
                         f"the block size {block_size}, got {interval}")


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


# --- instrumentation ---------------------------------------------------------------------


@dataclass
class PoolProbe:
    """Counts evictions and hashed blocks per group by wrapping the pool's
    `get_new_blocks` on the instance (behaviour unchanged): it sees every block a
    request is given, and so, with the request's hits, every block whose hash changed."""

    pool: Any
    evicted: Counter[int] = field(default_factory=Counter)  # group id -> blocks evicted
    touched: dict[int, Any] = field(default_factory=dict)
    hashed: dict[int, int] = field(default_factory=dict)  # block id -> group id
    per_group: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        original = self.pool.get_new_blocks

        def get_new_blocks(num_blocks: int) -> list[Any]:
            self._count_evictions(num_blocks)
            blocks: list[Any] = original(num_blocks)
            self.touched.update((b.block_id, b) for b in blocks)
            return blocks

        self.pool.get_new_blocks = get_new_blocks

    def _count_evictions(self, num_blocks: int) -> None:
        """Blocks `get_new_blocks` is about to take that still carry a hash (it drops it),
        by group."""
        if num_blocks > self.pool.get_num_free_blocks():
            return  # vLLM raises; nothing is evicted
        extra = self.pool.cached_block_hashes_by_block
        for i, block in enumerate(self.pool.free_block_queue.iter_blocks_after(None)):
            if i == num_blocks:
                break
            key = block.block_hash or next(iter(extra.get(block.block_id, ())), None)
            if key is not None:
                self.evicted[int.from_bytes(key[-4:], "big")] += 1  # get_group_id

    def settle(self, hit_blocks: Iterable[Any]) -> None:
        """Refresh the counts from the blocks the request could have changed: hashes are
        set or dropped only on blocks a request holds (its hits and the blocks it was
        given), so the rest of the pool is as before."""
        self.touched.update((b.block_id, b) for b in hit_blocks if not b.is_null)
        for block_id, block in self.touched.items():
            key = block.block_hash
            group = None if key is None else int.from_bytes(key[-4:], "big")  # get_group_id
            before = self.hashed.pop(block_id, None)
            if before is not None:
                self.per_group[before] -= 1
            if group is not None:
                self.hashed[block_id] = group
                self.per_group[group] += 1
        self.touched.clear()

    def counts(self, groups: frozenset[int]) -> int:
        return sum(self.per_group[g] for g in groups)

    def evictions(self, groups: frozenset[int]) -> int:
        return sum(self.evicted[g] for g in groups)


def check_pool(engine: Engine, probe: PoolProbe) -> None:
    """Integrity after a request (vLLM offers no checker): with nothing running, every
    block but the null block is free, the free list agrees with its counter, every hash
    entry points at a block holding that hash, and the probe's map matches the pool."""
    pool = engine.manager.block_pool
    free = pool.free_block_queue.get_all_free_blocks()
    used = [b for b in pool.blocks if b.ref_cnt > 0 and not b.is_null]
    assert len(free) == pool.get_num_free_blocks(), "free list length != counter"
    assert len(free) + len(used) == pool.num_gpu_blocks - 1, "free + used != total - null"
    assert not used, f"{len(used)} blocks still referenced after free"
    assert all(b.ref_cnt == 0 for b in free), "a free block is referenced"
    for key, entry in pool.cached_block_hash_to_block._cache.items():
        for block in entry.values() if isinstance(entry, dict) else (entry,):
            assert block.block_hash == key or key in pool.cached_block_hashes_by_block.get(
                block.block_id, ()), "hash map entry not held by its block"
    scan = {b.block_id: int.from_bytes(b.block_hash[-4:], "big") for b in pool.blocks
            if b.block_hash is not None}
    assert scan == probe.hashed, "incremental hashed-block map drifted"
    assert +probe.per_group == Counter(scan.values()), "per-group counts drifted"
    for mgr in engine.manager.coordinator.single_type_managers:
        assert not mgr.req_to_blocks, "a manager still tracks a freed request"


# --- replay ------------------------------------------------------------------------------


class PoolTooSmall(Exception):
    def __init__(self, needed: int, pool: int) -> None:
        super().__init__(f"needs {needed} blocks, the pool holds {pool}")


@dataclass
class Timer:
    ns: int = 0

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.ns += time.perf_counter_ns() - start


def make_request(index: int, prompt: list[int], n_output: int, hasher: Any) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max(n_output, 1), ignore_eos=True)
    return Request(request_id=str(index), prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, arrival_time=0.0, block_hasher=hasher)


def admit(engine: Engine, request: Any, timer: Timer, running: int = 0
          ) -> tuple[int, list[Any]]:
    """The waiting-queue branch of `Scheduler.schedule`: look up the cache, cut the first
    chunk, allocate; returns (hit tokens, hit blocks). With `running` other requests
    running, a request that does not fit raises NoRoom (it waits; nothing was taken)."""
    from vllm.v1.request import RequestStatus

    mgr = engine.manager
    timer.call(mgr.new_step_starts)
    blocks, hit, junction = timer.call(mgr.get_computed_blocks, request)
    request.shared_prefix_boundary = junction
    n_new = min(request.num_tokens - hit, engine.budget)
    n_new = engine.split(request, n_new, hit, 0)
    if running and not fits_to_the_end(engine, request, hit, blocks):
        raise NoRoom(f"request {request.request_id}: waits for room")
    new = None
    if n_new > 0:
        new = timer.call(mgr.allocate_slots, request, n_new, num_new_computed_tokens=hit,
                         new_computed_blocks=blocks, num_lookahead_tokens=0,
                         full_sequence_must_fit=engine.config.scheduler_config
                         .scheduler_reserve_full_isl, has_scheduled_reqs=running > 0)
    if new is None:
        if running and n_new > 0:
            raise NoRoom(f"request {request.request_id}: "
                         f"{too_small(engine, request, n_new, hit, blocks)}")
        raise too_small(engine, request, n_new, hit, blocks)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = hit
    finish_step(engine, request, n_new, timer)
    hit_blocks = [b for group in blocks.blocks for b in group]
    return hit, hit_blocks


def fits_to_the_end(engine: Engine, request: Any, hit: int, blocks: Any) -> bool:
    """The concurrent replay's admission gate (its own, not vLLM's): the request is
    admitted only if it and every running request can run to their ends in the pool's
    free blocks (unreferenced cached blocks count as free: vLLM evicts them). vLLM admits
    more and preempts a running request when a step runs short, recomputing it later;
    the replay never preempts, so it waits instead."""
    mgr = engine.manager
    final = request.num_prompt_tokens + request.max_tokens - 1
    hit_blocks = [list(g) for g in blocks.blocks]
    own = mgr.coordinator.get_num_blocks_to_allocate(
        request_id=request.request_id, num_tokens=final, new_computed_blocks=hit_blocks,
        num_encoder_tokens=0, total_computed_tokens=hit, num_local_computed_tokens=hit,
        num_tokens_main_model=final)
    # a running request's state blocks are replaced as it crosses block boundaries
    # (one more per Mamba group for a step); its KV grows to its final length
    others = sum(_later_attention_blocks(engine, r, r.num_computed_tokens)
                 + len(engine.mamba_groups) for r in engine.running)
    return own + others <= mgr.block_pool.get_num_free_blocks()


def step(engine: Engine, request: Any, timer: Timer) -> None:
    """The running-queue branch of `Scheduler.schedule`: the next chunk or decode token."""
    mgr = engine.manager
    timer.call(mgr.new_step_starts)
    n_new = min(request.num_tokens - request.num_computed_tokens, engine.budget,
                engine.max_model_len - request.num_computed_tokens - 1)
    n_new = engine.split(request, n_new)
    new = None
    if n_new > 0:
        new = timer.call(mgr.allocate_slots, request, n_new, num_lookahead_tokens=0)
    if new is None:
        raise too_small(engine, request, n_new, 0, None)
    finish_step(engine, request, n_new, timer)


def finish_step(engine: Engine, request: Any, n_new: int, timer: Timer) -> None:
    """What follows scheduling in a synchronous engine step: CoW retentions released
    (`_free_cow_retained_blocks`), the per-step hand-offs drained (else they pile up),
    the chunk counted as computed (`_update_after_schedule`). `num_in_flight_tokens`
    is raised there and lowered by `update_from_output` before the next step, so a
    lone synchronous request never shows it non-zero to the cache: it is left at 0."""
    mgr = engine.manager
    _, retained = timer.call(mgr.take_kv_cache_block_copies)
    if retained:
        timer.call(mgr.block_pool.free_blocks, retained)
    mgr.take_boundary_state_offloads()
    mgr.take_new_block_ids()
    request.num_computed_tokens += n_new


def too_small(engine: Engine, request: Any, n_new: int, hit: int, blocks: Any) -> Exception:
    """A failed allocation: nothing else runs, so no eviction can help and vLLM would
    wait (or preempt the request itself) forever. The blocks it needs at least: those it
    holds, those the step asked for, and the attention blocks its later tokens add."""
    if n_new <= 0:
        return RuntimeError(f"the scheduler would not schedule request {request.request_id} "
                            f"(chunk of 0 tokens at {request.num_computed_tokens})")
    mgr = engine.manager
    held = sum(1 for g in mgr.coordinator.get_blocks(request.request_id) for b in g
               if not b.is_null)
    computed = request.num_computed_tokens + hit
    hit_blocks = blocks.blocks if blocks is not None else mgr.empty_kv_cache_blocks.blocks
    asks = [(min(computed + n_new, engine.max_model_len), computed, False)]
    if blocks is not None and engine.config.scheduler_config.scheduler_reserve_full_isl:
        asks.append((request.num_tokens, hit, True))  # the admission gate's full prompt
    need = max(mgr.coordinator.get_num_blocks_to_allocate(
        request_id=request.request_id, num_tokens=tokens, new_computed_blocks=hit_blocks,
        num_encoder_tokens=0, total_computed_tokens=done, num_local_computed_tokens=done,
        num_tokens_main_model=tokens, apply_admission_cap=cap) for tokens, done, cap in asks)
    later = _later_attention_blocks(engine, request, computed + n_new)
    return PoolTooSmall(held + need + later, engine.kv_cache_config.num_blocks - 1)


def _later_attention_blocks(engine: Engine, request: Any, upto: int) -> int:
    """Attention blocks between `upto` tokens and the end of the processed sequence
    (`n_input + n_output - 1`; `max_tokens` is `n_output`, at least 1)."""
    final = request.num_prompt_tokens + request.max_tokens - 1
    managers = engine.manager.coordinator.single_type_managers
    return sum(max(0, -(-final // m.block_size) - -(-upto // m.block_size))
               for g, m in enumerate(managers) if g in engine.attention_groups)


def run_request(engine: Engine, seq: np.ndarray, n_input: int, index: int, hasher: Any,
                timer: Timer) -> tuple[int, list[Any]]:
    """One request from admission to `free`; returns its hit and hit blocks."""
    request, hit, hit_blocks = start_request(engine, seq, n_input, index, hasher, timer)
    finish_request(engine, request, seq[n_input:].tolist(), timer)
    return hit, hit_blocks


def start_request(engine: Engine, seq: np.ndarray, n_input: int, index: int, hasher: Any,
                  timer: Timer, running: int = 0) -> tuple[Any, int, list[Any]]:
    """Admission and every prefill chunk: (the running request, its hit, hit blocks)."""
    request = timer.call(make_request, index, seq[:n_input].tolist(), len(seq) - n_input,
                         hasher)
    hit, hit_blocks = admit(engine, request, timer, running)
    while request.num_computed_tokens < request.num_tokens:
        step(engine, request, timer)
    return request, hit, hit_blocks


def finish_request(engine: Engine, request: Any, outputs: list[int], timer: Timer
                   ) -> list[Any]:
    """From the first sampled token through decode to `free`; the blocks it held last."""
    from vllm.v1.core.sched.utils import check_stop

    sampled = 0
    while True:
        if request.num_computed_tokens >= request.num_tokens:  # the model samples a token
            if sampled == len(outputs):
                break  # only when the trace has no output: the prompt is all there is
            timer.call(request.append_output_token_ids, outputs[sampled])
            sampled += 1
            if check_stop(request, engine.max_model_len):
                break
        step(engine, request, timer)
    held = held_blocks(engine, request)
    timer.call(engine.manager.free, request)
    return held


def held_blocks(engine: Engine, request: Any) -> list[Any]:
    return [b for group in engine.manager.coordinator.get_blocks(request.request_id)
            for b in group if not b.is_null]


# result.npz: int64 per request unless named in FLOAT_COLUMNS.
COLUMNS = ("hit", "kv_blocks", "state_blocks", "evictions", "evicted_kv", "evicted_states",
           "micros")
FLOAT_COLUMNS = ("micros",)


def empty_results(n: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(n, dtype=np.float64 if name in FLOAT_COLUMNS else np.int64)
            for name in COLUMNS}


def replay(engine: Engine, trace: Trace, options: dict[str, Any]
           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    # EngineCore.__init__: the request block hasher (default algorithm sha256).
    hash_fn = get_hash_fn_by_name(engine.config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(engine.hash_block_size, hash_fn)
    probe = PoolProbe(engine.manager.block_pool)
    out, every = empty_results(len(trace)), options["progress_every"]
    schedule: dict[str, Any] = {}
    if options["concurrent"]:
        schedule = replay_concurrent(engine, trace, options, hasher, probe, out)
    else:
        for done, i in enumerate(trace.order.tolist(), 1):
            out["micros"][i] = run_one(engine, trace, i, hasher, probe, out)
            if options["check"]:
                check_request(engine, probe, i)
            if every and done % every == 0 and done < len(trace):
                print(f"progress {done} {len(trace)}", file=sys.stderr, flush=True)
    print(f"progress {len(trace)} {len(trace)}", file=sys.stderr, flush=True)
    totals = {"kv_blocks": probe.counts(engine.attention_groups),
              "state_blocks": probe.counts(engine.mamba_groups),
              "evicted_kv": probe.evictions(engine.attention_groups),
              "evicted_states": probe.evictions(engine.mamba_groups)
              // max(len(engine.mamba_groups), 1)}
    totals["evictions"] = totals["evicted_kv"] + probe.evictions(engine.mamba_groups)
    return out, {"totals": totals, **schedule}


def replay_concurrent(engine: Engine, trace: Trace, options: dict[str, Any], hasher: Any,
                      probe: PoolProbe, out: dict[str, np.ndarray]) -> dict[str, Any]:
    """Requests overlapping as they arrive (arrivals.py): admission and prefill at the
    start, decode and `free` at the finish; rows are taken at each start."""
    every, done, running = options["progress_every"], 0, 0
    last = [0]  # the request whose step ran last (an integrity failure names it)
    max_running = engine.config.scheduler_config.max_num_seqs

    def start(i: int) -> tuple[int, tuple[Any, list[Any]]]:
        nonlocal running
        timer = Timer()
        try:
            request, hit, hit_blocks = start_request(
                engine, trace.sequence(i), int(trace.n_input[i]), i, hasher, timer, running)
        except NoRoom:
            raise
        except PoolTooSmall as exc:
            raise UsageError(f"request {i}: {exc} (memory_bytes too small{_others(running)})"
                             ) from None
        except Exception as exc:
            raise RequestFailed(i, exc) from exc
        finally:
            out["micros"][i] += timer.ns / 1000.0
        running += 1
        engine.running.append(request)
        probe.settle(hit_blocks)
        out["hit"][i] = hit
        # a block's hash can be set after the settle above (a state block is cached
        # once a later step computes past it): settle them again at the finish
        return hit, (request, held_blocks(engine, request))

    def finish(i: int, handle: tuple[Any, list[Any]]) -> None:
        nonlocal running
        last[0] = i
        request, at_start = handle
        timer = Timer()
        seq = trace.sequence(i)
        try:
            at_end = finish_request(engine, request, seq[int(trace.n_input[i]):].tolist(),
                                    timer)
        except PoolTooSmall as exc:
            raise UsageError(f"request {i}: decoding {exc} (memory_bytes too small"
                             f"{_others(running - 1)})") from None
        except Exception as exc:
            raise RequestFailed(i, exc) from exc
        finally:
            out["micros"][i] += timer.ns / 1000.0
        running -= 1
        engine.running.remove(request)
        probe.settle(at_start + at_end)

    def started(i: int) -> None:
        nonlocal done
        _row(engine, probe, out, i)
        done += 1
        if every and done % every == 0 and done < len(trace):
            print(f"progress {done} {len(trace)}", file=sys.stderr, flush=True)

    def idle() -> None:
        if options["check"]:
            check_request(engine, probe, last[0])

    try:
        schedule = run_concurrent(
            trace.order.tolist(), trace.arrival, np.diff(trace.offsets) - trace.n_input,
            start, finish, Parent().ttft, options["decode_s_per_token"],
            max_running, started, idle)
    except NoRoom as exc:
        raise UsageError(str(exc)) from None
    return schedule.meta()


def _others(running: int) -> str:
    return f", {running} other request{'s' * (running != 1)} running" if running else ""


def _row(engine: Engine, probe: PoolProbe, out: dict[str, np.ndarray], i: int) -> None:
    out["kv_blocks"][i] = probe.counts(engine.attention_groups)
    out["state_blocks"][i] = probe.counts(engine.mamba_groups)
    out["evicted_kv"][i] = probe.evictions(engine.attention_groups)
    evicted_mamba = probe.evictions(engine.mamba_groups)
    out["evicted_states"][i] = evicted_mamba // max(len(engine.mamba_groups), 1)
    out["evictions"][i] = out["evicted_kv"][i] + evicted_mamba


def run_one(engine: Engine, trace: Trace, i: int, hasher: Any, probe: PoolProbe,
            out: dict[str, np.ndarray]) -> float:
    """Replay request i, record its row, return its microseconds in vLLM calls."""
    timer = Timer()
    try:
        hit, hit_blocks = run_request(engine, trace.sequence(i), int(trace.n_input[i]), i,
                                      hasher, timer)
    except PoolTooSmall as exc:
        raise UsageError(f"request {i}: {exc} (memory_bytes too small)") from None
    except Exception as exc:
        raise RequestFailed(i, exc) from exc
    probe.settle(hit_blocks)
    out["hit"][i] = hit
    _row(engine, probe, out, i)
    return timer.ns / 1000.0


def check_request(engine: Engine, probe: PoolProbe, i: int) -> None:
    try:
        check_pool(engine, probe)
    except Exception as exc:
        raise RequestFailed(i, exc) from exc


class RequestFailed(Exception):
    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"request {index}: {type(cause).__name__}: {cause}")


# --- main --------------------------------------------------------------------------------


def write_outputs(out_dir: Path, results: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write to temporary names, then rename, so a reader never sees half a result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_npz, tmp_json = out_dir / "result.tmp.npz", out_dir / "meta.json.tmp"
    columns: dict[str, Any] = dict(results)  # (numpy's stub types **kwds as allow_pickle)
    np.savez(tmp_npz, **columns)
    tmp_json.write_text(json.dumps(meta, indent=2) + "\n")
    tmp_npz.replace(out_dir / "result.npz")
    tmp_json.replace(out_dir / "meta.json")


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


def run(args: argparse.Namespace, started: float) -> None:
    options = load_options(args.options)
    trace = load_trace(args.trace)
    version = import_vllm()
    integration = install_integration(options)
    if integration is not None and options["check"]:  # every victim checked the plain way
        integration.order.check = True
    longest = int(np.diff(trace.offsets).max()) if len(trace) else 1
    engine = build_engine(options, longest + 1)  # max_model_len: never the limit
    replay_start = time.perf_counter()
    results, extra = replay(engine, trace, options)
    done = time.perf_counter()
    if integration is not None:
        if integration.tuning is not None:
            integration.tuning.close()
        extra["integration"] = integration.report()
    meta = {"engine": "vllm", "version": version, "requests": len(trace),
            **engine_meta(engine), **extra, "options": options,
            "seconds": round(done - started, 3),
            "replay_seconds": round(done - replay_start, 3)}
    write_outputs(args.out, results, meta)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true",
                        help="load vLLM, print its version and exit (the setup's check)")
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--options", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.version and None in (args.trace, args.options, args.out):
        parser.error("--trace, --options and --out are required")
    try:
        if args.version:
            print(f"vllm {import_vllm()}")
            return 0
        run(args, time.perf_counter())
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # the contract: a traceback, then one error line, exit 1
        import traceback

        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        where = "" if isinstance(exc, RequestFailed) else f"setup: {type(exc).__name__}: "
        print(f"error: {where}{exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
