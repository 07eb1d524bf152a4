"""One request as vLLM 0.32's scheduler runs it around the real cache (`vllm_engine.py`),
as `vllm/v1/core/sched/scheduler.py` does for a lone request with synchronous scheduling
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

Every vLLM call goes through a `Timer`; a request the pool cannot hold raises
`PoolTooSmall`, or `NoRoom` (it waits) while others are running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.engines.real.arrivals import NoRoom
from marconi.engines.real.vllm_engine import Engine


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
