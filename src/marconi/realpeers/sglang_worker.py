"""Replay a trace through SGLang 0.5.23's real prefix cache, as its scheduler drives it.

What runs is SGLang's own code: `UnifiedRadixCache` (Full + Mamba components, the Python or
the Rust tree core) over `HybridReqToTokenPool` (request rows + the Mamba slot pool) and a
`HybridLinearKVPool` token allocator, driven per request through the scheduler's own steps:

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
extra-buffer pools are sized as SGLang's default overlap scheduler sizes them. The GPU-only
modules SGLang imports at load time are stubbed (`install_stubs`), and `sglang/__init__.py`
(the frontend language) is skipped.

    python sglang_worker.py --trace TRACE.npz --options OPTIONS.json --out DIR
    python sglang_worker.py --version

Writes DIR/result.npz (per request: hit, kv_tokens, states, evicted_kv, evicted_states,
micros) and DIR/meta.json; prints `progress DONE TOTAL` on stderr. A failure ends with one
line `error: ...` on stderr: exit 2 for bad options, a wrong SGLang version or a request the
pools cannot hold; exit 1 for anything unexpected.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import sys
import time
import traceback
import types
import warnings
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from arrivals import NoRoom, Parent, run_concurrent  # beside this script
from engine_flags import SGLANG_CORES as CORES  # beside this script: the systems' flags
from engine_flags import SGLANG_DEFAULTS
from engine_flags import SGLANG_EVICTIONS as EVICTIONS
from engine_flags import SGLANG_STRATEGIES as STRATEGIES

SUPPORTED_VERSION = "0.5.23"
DEFAULTS: dict[str, Any] = {
    **SGLANG_DEFAULTS,  # strategy, eviction, page_size, chunked_prefill_size (-1: none), core
    "track_interval": 256,  # --mamba-track-interval
    "mamba_chunk_size": None,  # the model's; None: SGLang's fallback, FLA's CHUNK_SIZE (64)
    "check": False, "progress_every": 0,
    # requests overlap as they arrive (arrivals.py): each runs TTFT (from the parent, on
    # stdin) + decode_s_per_token x n_output; false: one at a time, in arrival order
    "concurrent": False, "decode_s_per_token": 0.02,
    # marconi's eviction inside this SGLang (marconi.integrations.sglang, imported from
    # `src`, the only marconi this worker ever imports): null, or {"policy": "marconi",
    # "spec": a ModelSpec's fields, "alpha": null (tuned) or a number, "background":
    # whether the tuner runs in its thread, "src": the folder holding marconi}
    "integration": None,
    "model": None,  # marconi's layer byte sizes: recorded, not used (only indices matter)
}
REQUIRED = ("kv_tokens", "mamba_slots")
FLA_CHUNK_SIZE = 64  # sglang.kernels.ops.attention.fla.chunk_delta_h.CHUNK_SIZE
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens default
INIT_NEW_TOKEN_RATIO = 0.7  # the scheduler's starting new_token_ratio (its default)


class UsageError(Exception):
    """Bad options, a wrong engine version, or a request the pools cannot hold: exit 2."""


# --- stubs: SGLang imports GPU-only modules at load time ----------------------------------


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__path__ = []  # a package, so its stubbed submodules import
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def _jit(fn: Any = None, **_: Any) -> Any:
    """`@triton.jit` and `@triton.jit(...)`: the kernels are never launched here."""
    return fn if callable(fn) else (lambda f: f)


def _unpinned(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return self


class _StubClass:
    """A base class for the kernel-FFI classes SGLang subclasses at import time."""


def install_stubs() -> None:
    """Make SGLang importable without a GPU. Before the stubs: import torch's compiler
    (it probes for triton once, and must find none) and ask transformers whether
    torchvision exists (cached, so the torchvision stub below is never taken for one)."""
    import torch._dynamo
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    patched: Any = torch  # typed Any: these replace torch's own (typed) callables
    patched.compile = _jit  # decorators only; nothing is compiled or run
    patched.Tensor.pin_memory = _unpinned  # pinning needs an accelerator; nothing is copied
    _stub("triton", jit=_jit, language=_stub("triton.language", constexpr=int))
    sys.modules["triton"].language.extra = _stub("triton.language.extra", libdevice=None)
    _stub("tvm_ffi", Object=_StubClass, Module=_StubClass)  # JIT kernel loader
    _stub("torchvision", transforms=_stub(  # image preprocessing of VLM configs
        "torchvision.transforms", InterpolationMode=None,
        functional=_stub("torchvision.transforms.functional", InterpolationMode=None)))
    _stub("IPython", display=_stub("IPython.display", HTML=None, display=None))


def _skip_frontend_init() -> None:
    """`import sglang` runs the frontend language's `__init__` (aiohttp, IPython,
    tqdm...); an empty package object over the same folder loads `sglang.srt` alone."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations is not None
    package = types.ModuleType("sglang")
    package.__spec__, package.__file__ = spec, spec.origin
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["sglang"] = package


def check_version() -> str:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"sglang is not installed; this worker drives sglang "
                         f"{SUPPORTED_VERSION}") from None
    if version != SUPPORTED_VERSION:
        raise UsageError(f"sglang {version} is installed; this worker drives sglang "
                         f"{SUPPORTED_VERSION} only")
    return version


SGLANG_NAMES = {  # module: the names the replay calls
    "sglang.srt.configs.mamba_utils": ("Mamba2CacheParams", "Mamba2StateShape"),
    "sglang.srt.environ": ("envs",),
    "sglang.srt.managers.schedule_batch": ("Req", "ScheduleBatch"),
    "sglang.srt.managers.schedule_policy": ("PrefillAdder", "SchedulePolicy"),
    "sglang.srt.managers.scheduler_components.batch_result_processor": (
        "SchedulerBatchResultProcessor",),
    "sglang.srt.mem_cache.allocator": ("TokenToKVPoolAllocator",),
    "sglang.srt.mem_cache.allocator.paged": ("PagedTokenToKVPoolAllocator",),
    "sglang.srt.mem_cache.cache_init_params": ("CacheInitParams",),
    "sglang.srt.mem_cache.common": ("checkpoint_kv_cache", "release_kv_cache"),
    "sglang.srt.mem_cache.memory_pool": ("HybridLinearKVPool", "HybridReqToTokenPool"),
    "sglang.srt.mem_cache.unified_cache.components.base": ("ComponentType",),
    "sglang.srt.mem_cache.unified_radix_cache": ("UnifiedRadixCache",),
    "sglang.srt.sampling.sampling_params": ("SamplingParams",),
    "sglang.srt.server_args": ("ServerArgs", "set_global_server_args_for_scheduler"),
    "sglang.srt.speculative.spec_info": ("SpeculativeAlgorithm",),
}


def load_sglang() -> types.SimpleNamespace:
    """The SGLang classes and functions the replay calls, by name."""
    install_stubs()
    _skip_frontend_init()
    found: dict[str, Any] = {}
    with warnings.catch_warnings():  # "Only CUDA ... support AWQ/GGUF": true, and moot here
        warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)
        for module_name, names in SGLANG_NAMES.items():
            module = importlib.import_module(module_name)
            found.update({name: getattr(module, name) for name in names})
    return types.SimpleNamespace(**found)


# --- options ----------------------------------------------------------------------------


def _int_option(key: str, value: Any, low: int, also: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"option {key!r}: {value!r} is not an integer >= {low}{also}")
    return value


def _choice_option(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"option {key!r}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _check_model(value: Any) -> Any:
    if value is not None and not (isinstance(value, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values())):
        raise UsageError(f"option 'model': {value!r} is not null or an object of integers")
    return value


def resolve_options(raw: Any) -> dict[str, Any]:
    """Every key checked, defaults filled in; UsageError naming the first bad key."""
    _check_keys(raw)
    opts = {**DEFAULTS, **raw}
    for key in ("kv_tokens", "mamba_slots", "page_size", "track_interval"):
        _int_option(key, opts[key], 1)
    if opts["chunked_prefill_size"] != -1:
        _int_option("chunked_prefill_size", opts["chunked_prefill_size"], 1,
                    " or -1 (no chunking)")
    _int_option("progress_every", opts["progress_every"], 0)
    if opts["mamba_chunk_size"] is not None:
        _int_option("mamba_chunk_size", opts["mamba_chunk_size"], 1, " or null")
    for key, allowed in (("strategy", STRATEGIES), ("eviction", EVICTIONS), ("core", CORES)):
        _choice_option(key, opts[key], allowed)
    for key in ("check", "concurrent"):
        if not isinstance(opts[key], bool):
            raise UsageError(f"option {key!r}: {opts[key]!r} is not true or false")
    decode = opts["decode_s_per_token"]
    if isinstance(decode, bool) or not isinstance(decode, int | float) or not decode >= 0:
        raise UsageError(f"option 'decode_s_per_token': {decode!r} is not a number >= 0")
    _check_model(opts["model"])
    _check_integration(opts["integration"])
    _check_combination(opts)
    # SGLang's pool is whole pages (`calculate_pool_sizes`: tokens // page * page)
    opts["kv_tokens"] -= opts["kv_tokens"] % opts["page_size"]
    if not opts["kv_tokens"]:
        raise UsageError(f"option 'kv_tokens': less than one page of {opts['page_size']}")
    return opts


INTEGRATION_KEYS = ("policy", "spec", "alpha", "background", "src")


def _check_integration(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or sorted(value) != sorted(INTEGRATION_KEYS):
        raise UsageError(f"option 'integration': {value!r} is not null or an object with "
                         f"exactly {', '.join(INTEGRATION_KEYS)}")
    if not isinstance(value["spec"], dict) or not isinstance(value["src"], str):
        raise UsageError("option 'integration': 'spec' must be an object, 'src' a folder")


def install_integration(opts: dict[str, Any]) -> Any:
    """marconi's integration, installed before the cache is built; None without one."""
    wanted = opts["integration"]
    if wanted is None:
        return None
    sys.path.insert(0, wanted["src"])
    common = importlib.import_module("marconi.integrations.common")
    try:
        return common.install_from("sglang", wanted)
    except common.IntegrationError as err:
        raise UsageError(str(err)) from None


def _check_keys(raw: Any) -> None:
    if not isinstance(raw, dict):
        raise UsageError("options: not a JSON object")
    known = (*REQUIRED, *DEFAULTS)
    for key in raw:
        if key not in known:
            raise UsageError(f"option {key!r}: unknown (allowed: {', '.join(known)})")
    for key in REQUIRED:
        if key not in raw:
            raise UsageError(f"option {key!r}: missing (an integer >= 1)")


def _check_combination(opts: dict[str, Any]) -> None:
    """What SGLang's server-argument validation refuses, refused here first."""
    page, chunk = opts["page_size"], opts["mamba_chunk_size"] or FLA_CHUNK_SIZE
    if opts["strategy"] == "no_buffer" and page != 1:
        raise UsageError("option 'page_size': no_buffer only supports 1 (allowed: 1)")
    if max(page, chunk) % min(page, chunk):
        raise UsageError(f"option 'page_size': {page} and mamba_chunk_size {chunk} must "
                         "divide one another")
    if opts["chunked_prefill_size"] != -1 and opts["chunked_prefill_size"] % page:
        raise UsageError(f"option 'chunked_prefill_size': {opts['chunked_prefill_size']} "
                         f"is not a multiple of page_size {page}")
    need = slots_per_running_request(opts["strategy"])
    if opts["mamba_slots"] < need:
        raise UsageError(f"option 'mamba_slots': {opts['mamba_slots']} is too few for "
                         f"{opts['strategy']}, which budgets {need} per running request "
                         f"(SGLang refuses to start below {need})")
    if opts["strategy"] != "no_buffer" and opts["track_interval"] % page:
        raise UsageError(f"option 'track_interval': {opts['track_interval']} is not a "
                         f"multiple of page_size {page}")


# --- the engine -------------------------------------------------------------------------


def overlapped(strategy: str) -> bool:
    """Whether SGLang would run the overlap scheduler: its default, which no_buffer
    forbids. It sizes the extra buffer (2 ping-pong slots, which lazy needs); the replay
    itself always handles a step's result before the next step."""
    return strategy != "no_buffer"


def slots_per_running_request(strategy: str) -> int:
    """SGLang's `_calculate_mamba_ratio`: the Mamba slots it budgets per running request,
    `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` (3; no_buffer's binding limit is its
    prefill-to-decode peak) plus the extra buffer's ping-pong tracking slots
    (`get_mamba_tracking_slots`: 2 with overlap, 1 lazy). It caps `max_running_requests`
    at `max_mamba_cache_size` // this and refuses to start below one request."""
    return {"no_buffer": 3, "extra_buffer": 5, "extra_buffer_lazy": 4}[strategy]


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


# --- the replay -------------------------------------------------------------------------


class Trace:
    """The worker's trace file: every full sequence in one array, cut by `offsets`."""

    def __init__(self, path: Path):
        try:
            with np.load(path) as data:
                self.tokens = data["tokens"]
                self.offsets = data["offsets"].astype(np.int64)
                self.n_input = data["n_input"].astype(np.int64)
                self.arrival = data["arrival"].astype(np.float64)
        except (OSError, KeyError, ValueError) as err:
            raise UsageError(f"trace {path}: {err}") from None
        n = len(self.n_input)
        if len(self.offsets) != n + 1 or (np.diff(self.offsets) < 0).any() \
                or self.offsets[-1] != len(self.tokens):
            raise UsageError(f"trace {path}: offsets do not cut tokens into {n} requests")
        if len(self.arrival) != n or (np.diff(self.arrival) < 0).any():
            raise UsageError(f"trace {path}: arrivals are not {n} times in order")
        lengths = np.diff(self.offsets)
        self.n_output = lengths - self.n_input
        bad = np.flatnonzero((self.n_input < 1) | (self.n_input > lengths))
        if len(bad):
            raise UsageError(f"request {bad[0]}: {self.n_input[bad[0]]} input tokens of a "
                             f"{lengths[bad[0]]}-token sequence (needs 1 to all of it)")

    def __len__(self) -> int:
        return len(self.n_input)

    def request(self, i: int) -> tuple[np.ndarray, int]:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]], int(self.n_input[i])

    def max_len(self) -> int:
        return int(np.diff(self.offsets).max(initial=1))


OUT_OF_MEMORY = ("out of memory", "runs out of memory", "not enough space for mamba")


def pool_error(i: int, err: Exception) -> UsageError | None:
    """SGLang's own allocation failure (its pools too small even after eviction) as
    the request's one-line error; None for any other exception."""
    text = " ".join(str(err).split())
    if not any(marker in text.lower() for marker in OUT_OF_MEMORY):
        return None
    return UsageError(f"request {i}: SGLang cannot allocate it: {text}")


def check_invariants(replayer: Replayer) -> None:
    """What the scheduler checks when idle: the tree's `sanity_check`, and that every KV
    token, Mamba slot and request row is either free or held by the tree."""
    cache, req_pool = replayer.cache, replayer.req_pool
    cache.sanity_check()
    kv = (replayer.allocator.available_size(), cache.full_evictable_size(),
          cache.full_protected_size(), replayer.allocator.size)
    mamba = (req_pool.mamba_allocator.available_size(), cache.mamba_evictable_size(),
             cache.mamba_protected_size(), req_pool.mamba_pool.size)
    for name, (free, evictable, protected, total) in (("KV token", kv), ("Mamba", mamba)):
        if free + evictable + protected != total:
            raise AssertionError(f"{name} pool leak: {free} free + {evictable} evictable + "
                                 f"{protected} protected != {total}")
    if len(req_pool.free_slots) != req_pool.size:
        raise AssertionError(f"request rows leak: {len(req_pool.free_slots)} free of "
                             f"{req_pool.size}")


COLUMNS = ("hit", "kv_tokens", "states", "evicted_kv", "evicted_states")


class RequestFailed(Exception):
    """An unexpected exception while serving (or checking after) request `index`."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"request {index}: {type(cause).__name__}: "
                         f"{' '.join(str(cause).split())}")
        self.index, self.cause = index, cause


def replay(replayer: Replayer, trace: Trace, opts: dict[str, Any]
           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every request, one at a time in order or overlapping as they arrive; the
    per-request columns and what the cache holds and evicted in the end."""
    n, every = len(trace), opts["progress_every"]
    columns = {key: np.zeros(n, dtype=np.int64) for key in COLUMNS}
    columns["micros"] = np.zeros(n, dtype=np.float64)
    done, last = 0, [0]  # requests started; the request whose step ran last

    def started(i: int) -> None:
        nonlocal done
        _record(replayer, columns, i)
        done += 1
        if every and done % every == 0 and done < n:
            print(f"progress {done} {n}", file=sys.stderr, flush=True)

    def idle() -> None:
        if opts["check"]:
            _guarded(last[0], check_invariants, replayer)

    schedule: dict[str, Any] = {}
    if opts["concurrent"]:
        def start(i: int) -> tuple[int, Running]:
            seq, n_in = trace.request(i)
            last[0] = i
            hit, running = _timed(columns, i, replayer.start, i, seq, n_in)
            columns["hit"][i] = hit
            return hit, running

        def finish(i: int, running: Running) -> None:
            last[0] = i
            _timed(columns, i, replayer.finish, i, running)

        try:
            schedule = run_concurrent(
                range(n), trace.arrival, trace.n_output, start, finish, Parent().ttft,
                opts["decode_s_per_token"], max_running_requests(opts), started, idle).meta()
        except NoRoom as err:
            raise UsageError(str(err)) from None
    else:
        for i in range(n):
            seq, n_in = trace.request(i)
            last[0] = i
            columns["hit"][i] = _timed(columns, i, replayer.run, i, seq, n_in)
            started(i)
            idle()
    print(f"progress {n} {n}", file=sys.stderr, flush=True)
    cache = replayer.cache
    totals = {"kv_tokens": cache.full_evictable_size() + cache.full_protected_size(),
              "states": cache.mamba_evictable_size() + cache.mamba_protected_size(),
              "evicted_kv": replayer.evicted[0], "evicted_states": replayer.evicted[1]}
    return columns, {"totals": totals, **schedule}


def _record(replayer: Replayer, columns: dict[str, np.ndarray], i: int) -> None:
    """Request i's row: what the tree holds now (with whatever else is running)."""
    cache = replayer.cache
    columns["kv_tokens"][i] = cache.full_evictable_size() + cache.full_protected_size()
    columns["states"][i] = cache.mamba_evictable_size() + cache.mamba_protected_size()
    columns["evicted_kv"][i], columns["evicted_states"][i] = replayer.evicted


def _timed(columns: dict[str, np.ndarray], i: int, fn: Any, *args: Any) -> Any:
    start = time.perf_counter()
    try:
        return _guarded(i, fn, *args)
    finally:
        columns["micros"][i] += (time.perf_counter() - start) * 1e6


def _guarded(i: int, fn: Any, *args: Any) -> Any:
    """`fn(*args)` for request i (or the integrity check after it): SGLang's allocation
    failures as one-line usage errors, anything unexpected as RequestFailed."""
    try:
        return fn(*args)
    except (UsageError, NoRoom):
        raise
    except (RuntimeError, AssertionError) as err:
        if fn is check_invariants:
            err = AssertionError(f"integrity check failed after it: {err}")
        elif (usage := pool_error(i, err)) is not None:
            raise usage from err
        raise RequestFailed(i, err) from err
    except Exception as err:
        raise RequestFailed(i, err) from err


# --- command line -----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trace", type=Path, help="the trace (.npz)")
    parser.add_argument("--options", type=Path, help="the options (.json)")
    parser.add_argument("--out", type=Path, help="folder for result.npz and meta.json")
    parser.add_argument("--version", action="store_true",
                        help="load the engine, print its version and exit")
    args = parser.parse_args(argv)
    if not args.version and None in (args.trace, args.options, args.out):
        parser.error("--trace, --options and --out are required")
    return args


def read_options(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"options {path}: {err}") from None
    return resolve_options(raw)


def write_result(out: Path, columns: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = dict(columns)
    np.savez(out / "result.npz", **arrays)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def run_worker(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    version = check_version()
    if args.version:
        load_sglang()
        print(f"sglang {version}")
        return 0
    opts = read_options(args.options)
    trace = Trace(args.trace)
    for name in ("result.npz", "meta.json"):  # a failed run must leave no result
        (args.out / name).unlink(missing_ok=True)
    sgl = load_sglang()
    integration = install_integration(opts)
    replayer = Replayer(sgl, opts, trace.max_len())
    columns, extra = replay(replayer, trace, opts)
    if integration is not None:
        if integration.tuning is not None:
            integration.tuning.close()
        extra["integration"] = integration.report()
    meta = {"engine": "sglang", "version": version, "requests": len(trace),
            "options": opts, "seconds": time.perf_counter() - start, **extra}
    write_result(args.out, columns, meta)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run_worker(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RequestFailed as err:
        traceback.print_exception(err.cause)
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # any failure ends in one line
        traceback.print_exc()
        print(f"error: setup: {type(err).__name__}: {' '.join(str(err).split())}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
