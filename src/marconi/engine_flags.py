"""The engines marconi drives as their own code and the engine flags its systems set and
the workers pass on, declared once: the systems' options (`marconi.systems.engines`), the
environments (`marconi.engines.real.envs`) and the workers' checks and defaults
(`marconi.engines.real.sglang_worker`, `vllm_worker`) read these. It sits at the bottom of
the house (docs/architecture.md, "Layers") so that the registry below the engines and the
workers above it read one table. Standard library only: the workers run in the engines'
own environments."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    name: str  # the environment's folder name
    version: str  # the one version its worker drives
    system: str  # the registered system that runs it
    kind: str = ""  # the worker's prefix (default: `name`): vllm-0.33 runs vLLM's worker

    @property
    def worker(self) -> str:
        """The worker's module, run as a module of this package (`worker_command`)."""
        return f"marconi.engines.real.{self.kind or self.name}_worker"


ENGINES = {
    "sglang": Engine(name="sglang", version="0.5.23", system="sglang-0.5.23"),
    "vllm": Engine(name="vllm", version="0.32.0", system="vllm-0.32"),
    # vLLM 0.33's and 0.34's cache classes from their GPU wheels (no CPU build exists): no server
    "vllm-0.33": Engine(name="vllm-0.33", version="0.33.0", system="vllm-0.33", kind="vllm"),
    "vllm-0.34": Engine(name="vllm-0.34", version="0.34.0", system="vllm-0.34", kind="vllm"),
}


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
