"""SGLang 0.5.23's cache and pools, built as its scheduler builds them, and one request run
through them as the scheduler runs it (`Replayer`): `UnifiedRadixCache` (Full + Mamba
components, the Python or the Rust tree core) over `HybridReqToTokenPool` (request rows +
the Mamba slot pool) and a `HybridLinearKVPool` token allocator, driven per request
through the scheduler's own steps:

1. `SchedulePolicy.calc_priority` (fcfs), then `Req.init_next_round_input(tree_cache)`:
   the match (capped at n_input - 1; a hit copies the matched Mamba state into a fresh
   working slot), inside the scheduler's `mamba_allocator.alloc_group_begin/end`;
2. `PrefillAdder.add_one_req`: admission, the first chunk's length, `tree_cache.lock`;
3. per chunk `ScheduleBatch.prepare_for_extend` (`alloc_for_extend`: request row, Mamba
   working slot and ping-pong slots, KV slots, extra-buffer tracking); between chunks
   `checkpoint_kv_cache` (the scheduler's `stash_chunked_request`) and
   `PrefillAdder.add_chunked_req` for the next chunk;
4. the prefill result as `process_batch_result_prefill` handles it: the first sampled token,
   then `release_kv_cache(checkpoint=True)` if that finished it, else `checkpoint_kv_cache`;
5. per decode step `ScheduleBatch.check_decode_mem` (evicts if need be) and
   `prepare_for_decode` (one KV slot, the decode tracking boundary), the sampled token,
   and `SchedulerBatchResultProcessor._handle_finish_state_updated_req` (Mamba track
   bookkeeping; on the last token the final `release_kv_cache`, which inserts
   n_input + n_output - 1 tokens).

No model runs: nothing reads the tensors, only slot indices matter, so the pools are built
with one attention layer, one Mamba layer and tiny head sizes. The KV pool holds
`kv_tokens` (whole pages) and the Mamba pool `mamba_slots`: SGLang's two pools, from which
the running request's KV and Mamba slots are taken as well as the tree's. Requests run one
at a time in file (arrival) order, each step's result handled before the next step; the
extra-buffer pools are sized as SGLang's default overlap scheduler sizes them.
"""

from __future__ import annotations

import types
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marconi.engines.real.arrivals import NoRoom
from marconi.engines.real.sglang_options import (
    FLA_CHUNK_SIZE,
    UsageError,
    slots_per_running_request,
)

MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens default
INIT_NEW_TOKEN_RATIO = 0.7  # the scheduler's starting new_token_ratio (its default)


def overlapped(strategy: str) -> bool:
    """Whether SGLang would run the overlap scheduler: its default, which no_buffer
    forbids. It sizes the extra buffer (2 ping-pong slots, which lazy needs); the replay
    itself always handles a step's result before the next step."""
    return strategy != "no_buffer"


def publish_server_args(sgl: types.SimpleNamespace, opts: dict[str, Any]) -> None:
    """The scheduler's configuration, published as `launch_server` publishes it."""
    args = sgl.ServerArgs(
        model_path="dummy", page_size=opts["page_size"],
        chunked_prefill_size=opts["chunked_prefill_size"],
        mamba_radix_cache_strategy=opts["strategy"], mamba_track_interval=opts["track_interval"],
        radix_eviction_policy=opts["eviction"],
        disable_overlap_schedule=not overlapped(opts["strategy"]))
    # a model-less server: the chunk size its HF config would give (what SGLang's own
    # unit fixtures preset): max(model mamba_chunk_size or FLA's 64, page size)
    chunk = opts["mamba_chunk_size"] or FLA_CHUNK_SIZE
    args._mamba_cache_chunk_size = max(chunk, opts["page_size"])
    sgl.set_global_server_args_for_scheduler(args)


def build_pools(sgl: types.SimpleNamespace, opts: dict[str, Any], max_len: int) -> tuple:
    """The request rows with the Mamba slot pool, and the KV allocator over its pool."""
    extra = opts["strategy"] != "no_buffer"
    req_pool = sgl.HybridReqToTokenPool(
        # the pool is `max_mamba_cache_size` = mamba_slots, as SGLang sizes it from memory:
        # the running request's slots (working slot, ping-pong tracking slots) are not
        # extra but come out of it, as they do in SGLang, which sizes no separate pool
        size=max_running_requests(opts), mamba_size=opts["mamba_slots"],
        mamba_spec_state_size=1, max_context_len=max_len + opts["page_size"], device="cpu",
        enable_memory_saver=False, cache_params=_mamba_params(sgl), mamba_layer_ids=[0],
        enable_mamba_extra_buffer=extra,
        enable_mamba_extra_buffer_lazy=opts["strategy"] == "extra_buffer_lazy",
        enable_overlap_schedule=overlapped(opts["strategy"]))
    # one attention layer of one 1-wide head: the tensors are never read
    kv_pool = sgl.HybridLinearKVPool(
        size=opts["kv_tokens"], dtype=torch.bfloat16, page_size=opts["page_size"], head_num=1,
        head_dim=1, full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False,
        mamba_pool=req_pool.mamba_pool)
    # the allocator `_build_token_to_kv_pool_allocator` picks for a plain (non-SWA) pool
    if opts["page_size"] == 1:
        allocator = sgl.TokenToKVPoolAllocator(
            size=opts["kv_tokens"], dtype=torch.bfloat16, device="cpu", kvcache=kv_pool,
            need_sort=False)
    else:
        allocator = sgl.PagedTokenToKVPoolAllocator(
            size=opts["kv_tokens"], page_size=opts["page_size"], dtype=torch.bfloat16,
            device="cpu", kvcache=kv_pool, need_sort=False)
    return req_pool, allocator


def _mamba_params(sgl: types.SimpleNamespace) -> Any:
    """One Mamba2 layer of tiny state: only the slot indices matter."""
    with sgl.envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = sgl.Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=1, head_dim=16,
            state_size=1, conv_kernel=2)
        return sgl.Mamba2CacheParams(shape=shape, layers=[0])


def build_cache(sgl: types.SimpleNamespace, opts: dict[str, Any], max_len: int) -> Any:
    publish_server_args(sgl, opts)
    req_pool, allocator = build_pools(sgl, opts, max_len)
    params = sgl.CacheInitParams(
        req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator,
        page_size=opts["page_size"], disable=False,
        tree_components=(sgl.ComponentType.FULL, sgl.ComponentType.MAMBA),
        enable_mamba_extra_buffer=opts["strategy"] != "no_buffer",
        eviction_policy=opts["eviction"])
    with sgl.envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override(opts["core"]):
        cache = sgl.UnifiedRadixCache(params=params)
    if cache._tree_core_backend != opts["core"]:
        raise UsageError(f"option 'core': SGLang chose the {cache._tree_core_backend} tree "
                         f"core instead of {opts['core']}")
    return cache


def max_running_requests(opts: dict[str, Any]) -> int:
    """SGLang's cap on running requests for a hybrid model: `max_mamba_cache_size` //
    the slots it budgets per running request (one at a time unless concurrent)."""
    if not opts["concurrent"]:
        return 1
    return opts["mamba_slots"] // slots_per_running_request(opts["strategy"])


@dataclass
class Running:
    """A request past its prefill chunks, holding its locks, row and slots."""

    req: Any
    batch: Any
    seq: np.ndarray
    n_in: int


class Replayer:
    """One cache, its pools, and the scheduler's per-request steps over them."""

    def __init__(self, sgl: types.SimpleNamespace, opts: dict[str, Any], max_len: int):
        self.sgl, self.opts = sgl, opts
        self.running: list[Running] = []
        self.cache = build_cache(sgl, opts, max_len)
        self.req_pool = self.cache.req_to_token_pool
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.model_config = types.SimpleNamespace(
            vocab_size=1 << 31, is_encoder_decoder=False, is_multimodal=False,
            hf_text_config=types.SimpleNamespace(
                mamba_chunk_size=opts["mamba_chunk_size"] or FLA_CHUNK_SIZE))
        self.processor = self._result_processor()
        # --schedule-policy fcfs (the default): it orders nothing, but every 32nd pass
        # with a waiting request it refreshes that request's prefix in the LRU
        self.policy = sgl.SchedulePolicy("fcfs", self.cache, False, False, False)
        self.evicted = [0, 0]  # KV tokens, Mamba states: summed from the cache's _evict
        self._count_evictions()

    def _result_processor(self) -> Any:
        """The scheduler's result processor; only its per-request finish path runs, which
        reads the tree cache and the pools (the other collaborators are never touched)."""
        unused = ("hisparse_coordinator", "decode_offload_manager", "metrics_collector",
                  "metrics_reporter", "draft_worker", "model_worker",
                  "logprob_result_processor", "output_streamer", "beam_coordinator",
                  "abort_request")
        return self.sgl.SchedulerBatchResultProcessor(
            is_generation=True, disaggregation_mode=None, enable_overlap=False,
            enable_overlap_mlx=False, model_config=self.model_config,
            token_to_kv_pool_allocator=self.allocator, tree_cache=self.cache,
            req_to_token_pool=self.req_pool, **dict.fromkeys(unused))

    def _count_evictions(self) -> None:
        """Every eviction goes through `UnifiedRadixCache._evict`, which returns what it
        evicted; wrap it to add the counts up (the call itself is unchanged)."""
        evict = self.cache._evict

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = evict(*args, **kwargs)
            self.evicted[0] += result.num_tokens_evicted
            self.evicted[1] += result.mamba_num_evicted
            return result

        self.cache._evict = counted

    # --- one request, as the scheduler runs it -------------------------------------------

    def run(self, i: int, seq: np.ndarray, n_in: int) -> int:
        """Serve request `i` (its full sequence, `n_in` of it input); the hit."""
        hit, running = self.start(i, seq, n_in)
        self.finish(i, running)
        return hit

    def start(self, i: int, seq: np.ndarray, n_in: int) -> tuple[int, Running]:
        """Admit request `i` and run its prefill chunks: (hit, the running request).
        NoRoom when SGLang would leave it waiting (reverted as the scheduler reverts it)."""
        req = self._new_req(i, seq, n_in)
        adder, hit = self._admit(i, req)
        chunked = adder.new_chunked_req
        batch = self._extend(req, chunked)
        while chunked is not None:  # a middle chunk's result, then the next chunk
            req.inflight_middle_chunks -= 1
            chunked, batch = self._next_chunk(i, req)
        running = Running(req=req, batch=batch, seq=seq, n_in=n_in)
        self.running.append(running)
        return hit, running

    def finish(self, i: int, running: Running) -> None:
        """The prefill's result, then every decode step to the request's end."""
        self.running.remove(running)
        req, batch, seq, n_in = running.req, running.batch, running.seq, running.n_in
        first = int(seq[n_in]) if len(seq) > n_in else 0  # n_output 0: still one sampled
        if self._prefill_done(req, first):
            return
        for token in seq[n_in + 1:]:  # each token sampled so far is fed back
            if self._decode_step(i, req, batch, int(token)):
                break

    def _new_req(self, i: int, seq: np.ndarray, n_in: int) -> Any:
        n_out = len(seq) - n_in
        # fixed length (the trace's): the adder reserves a running request's whole
        # remaining decode, not new_token_ratio of it (changes nothing one at a time)
        params = self.sgl.SamplingParams(temperature=0, max_new_tokens=n_out,
                                         ignore_eos=True)
        params.normalize(None)  # as the tokenizer manager does: no stop strings
        return self.sgl.Req(rid=str(i), origin_input_text="",
                            origin_input_ids=array("q", seq[:n_in].tolist()),
                            sampling_params=params)

    def _adder(self) -> Any:
        """A fresh PrefillAdder per scheduling pass, as `get_new_batch_prefill` builds it
        (no mixed decode tokens; the running batch is what runs concurrently, if any)."""
        chunk = self.opts["chunked_prefill_size"]
        return self.sgl.PrefillAdder(
            self.opts["page_size"], self.cache, self.allocator, self._running_batch(),
            INIT_NEW_TOKEN_RATIO, MAX_PREFILL_TOKENS, None if chunk == -1 else chunk)

    def _running_batch(self) -> Any:
        """The running requests, as the adder reserves their decode tokens."""
        return self.sgl.ScheduleBatch(reqs=[r.req for r in self.running])

    def _admit(self, i: int, req: Any) -> tuple[Any, int]:
        """The match and the admission of a waiting request; (adder, hit). A request the
        adder does not take has its matched Mamba slot freed, as `get_new_batch_prefill`
        reverts it, and raises NoRoom (it waits) or, with nothing running, UsageError."""
        self.policy.calc_priority([req], self._running_batch())
        adder = self._adder()
        mamba_allocator = self.req_pool.mamba_allocator
        mamba_allocator.alloc_group_begin(1)  # one request waiting
        req.init_next_round_input(self.cache)
        hit = req.prefix_len
        adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        mamba_allocator.alloc_group_end()
        if req not in adder.can_run_list:
            req.kv.mamba_cow_src_index = None
            req.kv.mamba_needs_clear = False
            if req.kv.holds_mamba:
                mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
                req.kv.mamba_pool_idx = None
            if self.running:
                raise NoRoom(self._too_big(i, req))
            raise UsageError(self._too_big(i, req))
        return adder, hit

    def _too_big(self, i: int, req: Any) -> str:
        extend = len(req.full_untruncated_fill_ids) - req.prefix_len
        reserve = min(req.sampling_params.max_new_tokens, 4096)  # CLIP_MAX_NEW_TOKENS
        return (f"request {i}: needs {extend + reserve + self.opts['page_size']} KV tokens "
                f"({extend} uncached input + {reserve} output reserved), the pool holds "
                f"{self.opts['kv_tokens']}{self._others()}")

    def _others(self) -> str:
        n = len(self.running)
        return f" with {n} other request{'s' * (n != 1)} running" if n else ""

    def _extend(self, req: Any, chunked: Any) -> Any:
        """One prefill forward of `req` (its next chunk): the batch, allocated."""
        if chunked is not None:
            req.inflight_middle_chunks += 1
        batch = self.sgl.ScheduleBatch.init_new(
            [req], self.req_pool, self.allocator, self.cache, self.model_config,
            enable_overlap=False, spec_algorithm=self.sgl.SpeculativeAlgorithm.NONE,
            chunked_req=chunked)
        batch.prepare_for_extend()
        return batch

    def _next_chunk(self, i: int, req: Any) -> tuple[Any, Any]:
        """The next scheduling pass of a chunked request: `stash_chunked_request`, then
        `add_chunked_req` for its next chunk; (still chunked or None, batch)."""
        if req.extend_end > req.prefix_len:
            self.sgl.checkpoint_kv_cache(req, self.cache)
        adder = self._adder()
        req.init_next_round_input()
        chunked = adder.add_chunked_req(req)
        if req not in adder.can_run_list:
            raise UsageError(self._too_big(i, req))
        return chunked, self._extend(req, chunked)

    def _prefill_done(self, req: Any, token: int) -> bool:
        """`process_batch_result_prefill` for the last chunk; whether that finished it."""
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            self.sgl.release_kv_cache(req, self.cache, checkpoint=True)
            return True
        self.sgl.checkpoint_kv_cache(req, self.cache)
        return False

    def _decode_step(self, i: int, req: Any, batch: Any, token: int) -> bool:
        """`update_running_batch` + one decode forward + its result; whether it finished."""
        if not batch.check_decode_mem():  # evicts; retracting the only request keeps it
            raise UsageError(f"request {i}: needs a KV token to decode at length "
                             f"{req.kv.kv_committed_len}, the pool holds "
                             f"{self.opts['kv_tokens']}{self._others()}")
        batch.prepare_for_decode()
        req.output_ids.append(token)
        req.update_finish_state(1)
        self.processor._handle_finish_state_updated_req(req, batch, _NO_SPEC, 0, None)
        return bool(req.finished())


_NO_SPEC = types.SimpleNamespace(num_correct_drafts_per_req_cpu=None,
                                 grammar_retained_tokens=None)
