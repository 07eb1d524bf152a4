"""The engine flags marconi's systems set and the workers pass on, declared once: the
systems' options (`marconi.systems.engines`) and the workers' checks and defaults
(`sglang_worker.py`, `vllm_worker.py`, which import it as a module of this package) read
these. Standard library only: the workers run in the engines' own environments."""

from __future__ import annotations

# --mamba-radix-cache-strategy
SGLANG_STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
SGLANG_EVICTIONS = ("lru", "lfu", "slru", "priority", "tlru")  # --radix-eviction-policy (0.5.23)
SGLANG_CORES = ("python", "rust")  # SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND
SGLANG_DEFAULTS: dict[str, object] = {
    "strategy": "no_buffer", "eviction": "lru", "page_size": 1,
    # server_args: 8192 on an H100/H200 (60-160 GB), 16384 from 160 GB up; -1: no chunking
    "chunked_prefill_size": 8192,
    "core": "python",
}

VLLM_CACHE_MODES = ("align",)  # --mamba-cache-mode: 0.32 knows align and none (no "all")
# CacheConfig.DEFAULT_BLOCK_SIZE, where the derived block size starts: 16 (0.32, 0.33), 64 (0.34)
VLLM_BLOCK_BASES = ("16", "64")
VLLM_DEFAULTS: dict[str, object] = {
    "mamba_cache_mode": "align",
    "block_size": None,  # --block-size; None: derived from the model as vLLM does
    "default_block_size": 16,  # vLLM 0.32's (the emulation's default; 0.34: 64)
    "max_num_batched_tokens": 8192,  # --max-num-batched-tokens
    # --prefix-cache-retention-interval: 0 (vLLM 0.32's default) keeps semantic
    # checkpoints only; None every state
    "retention_interval": 0,
}
