"""How the vLLM plugin hands over to its tuner (`common.Tuning`: marconi's bootstrap tuner
or marconi+'s shadow experts, in a child process or a thread beside the engine): each
finished request's tokens (`hand_over`), the tuner started at the first on a mirror of the
engine's pool (`start`: system `MIRROR` at vLLM's memory, block size and retention
interval). Each alpha it adopts is the engine's from its next eviction."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from marconi.engines.integrations.common import Counters, Tuning
from marconi.engines.integrations.vllm.costs import now
from marconi.engines.integrations.vllm.versions import log

MIRROR = "vllm-2026+marconi"  # the tuner's mirror: vLLM's admission, Marconi's order


def hand_over(tuning: Tuning, counters: Counters, request: Any, kv_cache_config: Any
              ) -> None:
    """A finished request's tokens to the tuner (started at the first)."""
    if not tuning.started:  # once: its cost is logged, not counted per request
        began = time.perf_counter()
        start(tuning, kv_cache_config)
        log.info("marconi: tuner started in %.0f ms (%s)", 1e3 * (time.perf_counter() - began),
                 f"process {tuning.remote.pid}" if tuning.remote is not None else
                 "a thread" if tuning.background else "inline")
    begun = now()
    if tuning.remote is not None:  # the request's own list: packed as it is written
        tuning.feed(getattr(request, "_all_token_ids", request.all_token_ids),
                    int(request.num_prompt_tokens))
    else:
        tuning.feed(np.asarray(request.all_token_ids, dtype=np.int32),
                    int(request.num_prompt_tokens))
    if tuning.background:
        counters.feed_ns += now() - begun


def start(tuning: Tuning, kv_cache_config: Any) -> None:
    """The tuner's mirror for the engine's pool: vLLM's memory (blocks x one block's bytes
    over a group's layers), block size and retention interval."""
    group = kv_cache_config.kv_cache_groups[0]
    memory = kv_cache_config.num_blocks * group.kv_cache_spec.page_size_bytes * len(
        group.layer_names)
    retention = kv_cache_config.prefix_cache_retention_interval
    system = (f"{MIRROR}:block_size={group.kv_cache_spec.block_size},"
              f"retention_interval={'none' if retention is None else retention}")
    tuning.start(system, memory, as_engine=True)
