"""Replay a trace through vLLM 0.34's GPU prefix cache with its CPU offload tier beside
it: the GPU pool is vLLM's own `KVCacheManager` (as `vllm_worker.py` drives it), the host
tier vLLM's own `CPUOffloadingManager` with the cache policy asked for: vLLM's `lru` or
`arc`, or an out-of-tree one loaded by vLLM's `CachePolicyFactory` from
`cache_policy_module_path` (marconi's: `marconi.engines.integrations.vllm_offload`), exactly as
`--kv-transfer-config` would load it. No model runs; no bytes move.

What it plays of vLLM's `OffloadingConnector` (its scheduler side), one request at a time:
1. the request is looked up in the GPU pool (vLLM's `get_computed_blocks`, by the
   scheduler's own admission: `vllm_scheduler.py`);
2. past the GPU's hit, the host tier is looked up block by block (`lookup`): the hit
   extends over every block whose KV is on the host in each attention group, up to the
   last such block whose state is there too in every Mamba group (align mode: a hit ends
   at a state), at most `n_input - 1` tokens; those chunks are loaded
   (`prepare_load`, `complete_load`);
3. the request runs (every prefill step and decode step, as `vllm_worker.py` runs it),
   and every block the GPU pool caches for it is offered to the host (`prepare_store`,
   evicting as the policy says; `complete_store`), then `on_request_finished`.
A chunk is one block (`blocks_per_chunk` 1); each key's position is its block's end.

Simplified against a served vLLM: the tokens loaded from the host are computed again by
the replay's GPU steps (the GPU pool ends up caching the same blocks a load would fill,
bar the align-mode states between), stores happen at the request's end rather than as
each chunk is computed, and no transfer takes time.

Usage (in vLLM 0.34's environment)::

    python -P -m marconi.engines.real.vllm_offload_worker --trace TRACE.npz \
        --options OPTIONS.json --out DIR

OPTIONS.json: the vLLM worker's options (`vllm_options.OPTION_RULES`) plus `offload`:
{host_bytes, policy ("lru", "arc" or a class name), module_path (null or a module),
src (a folder put first on the path, or null), env (variables set before the policy is
built)}. DIR receives `result.npz` (per request: `hit` tokens served, `gpu_hit` from the
GPU pool, `host_hit` tokens past it loaded from the host tier, `loaded` chunks, `micros`
spent in vLLM calls) and `meta.json` (the tier's size, stores and evictions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engines.real.vllm_engine import build_engine, engine_meta, import_vllm
from marconi.engines.real.vllm_options import UsageError, load_options, load_trace
from marconi.engines.real.vllm_replay import RequestFailed, worker_main
from marconi.engines.real.vllm_scheduler import Timer, finish_request, start_request
from marconi.engines.real.worker_io import progress, progress_every

OFFLOAD_KEYS = ("env", "host_bytes", "module_path", "policy", "src")


def split_options(path: Path) -> tuple[Path, dict[str, Any]]:
    """The vLLM worker's options (written beside, for `load_options`) and `offload`."""
    try:
        raw = json.loads(path.read_text())
        offload = raw.pop("offload")
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise UsageError(f"options {path}: expected a JSON object with 'offload' ({exc})"
                         ) from None
    if not isinstance(offload, dict) or sorted(offload) != list(OFFLOAD_KEYS):
        raise UsageError(f"option 'offload': expected an object with exactly "
                         f"{', '.join(OFFLOAD_KEYS)}")
    if not (isinstance(offload["host_bytes"], int) and offload["host_bytes"] > 0):
        raise UsageError(f"option 'offload.host_bytes': expected an integer > 0, got "
                         f"{offload['host_bytes']!r}")
    rest = path.with_name(path.stem + ".vllm.json")
    rest.write_text(json.dumps(raw))
    return rest, offload


def build_tier(engine: Any, offload: dict[str, Any]) -> Any:
    """vLLM's `CPUOffloadingManager` with the policy asked for, one block a chunk, as
    many chunks as `host_bytes` holds (a block's bytes over a group's layers)."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    if offload["src"]:
        sys.path.insert(0, offload["src"])
    os.environ.update({str(k): str(v) for k, v in offload["env"].items()})
    meta = engine_meta(engine)
    chunks = offload["host_bytes"] // int(meta["block_bytes"])
    if chunks < 1:
        raise UsageError(f"option 'offload.host_bytes': {offload['host_bytes']} bytes hold "
                         f"no block of {meta['block_bytes']} bytes")
    try:
        return CPUOffloadingManager(num_chunks=chunks, cache_policy=offload["policy"],
                                    cache_policy_module_path=offload["module_path"])
    except (ValueError, ImportError, AttributeError) as exc:
        raise UsageError(f"offload policy {offload['policy']!r}: {exc}") from None


def host_lookup(engine: Any, tier: Any, ctx: Any, request: Any, gpu_hit: int,
                n_input: int) -> tuple[int, list[bytes]]:
    """Tokens past `gpu_hit` the host tier serves, and the chunks to load for them."""
    from vllm.v1.kv_offload.base import LookupResult, make_offload_key

    size, hashes = engine.block_size, request.block_hashes
    hit, keys, pending = gpu_hit, [], []
    for j in range(gpu_hit // size, min(len(hashes), (n_input - 1) // size)):
        kv = [make_offload_key(hashes[j], g) for g in sorted(engine.attention_groups)]
        if any(tier.lookup(k, ctx) != LookupResult.HIT for k in kv):
            break
        pending.extend(kv)
        states = [make_offload_key(hashes[j], g) for g in sorted(engine.mamba_groups)]
        if all(tier.lookup(k, ctx) == LookupResult.HIT for k in states):
            hit, keys = (j + 1) * size, [*pending, *states]
    return hit, keys


def cached_keys(engine: Any, request: Any) -> list[bytes]:
    """Every (block, group) of the request the GPU pool holds a hash for, as offload keys
    in prefix order (what the connector offers the tier)."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    from vllm.v1.kv_offload.base import make_offload_key

    pool, out = engine.manager.block_pool, []
    groups = sorted(engine.attention_groups | engine.mamba_groups)
    for block_hash in request.block_hashes:
        for g in groups:
            key = make_block_hash_with_group_id(block_hash, g)
            if pool.cached_block_hash_to_block.get_one_block(key) is not None:
                out.append(make_offload_key(block_hash, g))
    return out


def replay(engine: Any, tier: Any, trace: Any, every: int
           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key

    hash_fn = get_hash_fn_by_name(engine.config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(engine.hash_block_size, hash_fn)
    n = len(trace)
    out = {name: np.zeros(n, dtype=np.int64) for name in ("hit", "gpu_hit", "host_hit",
                                                          "loaded")}
    out["micros"] = np.zeros(n, dtype=np.float64)
    stores = evicted = refused = 0
    for done, i in enumerate(trace.order.tolist(), 1):
        timer, seq, n_input = Timer(), trace.sequence(i), int(trace.n_input[i])
        ctx = ReqContext(req_id=str(i))
        try:
            timer.call(tier.on_new_request, ctx)
            request, gpu_hit, _ = start_request(engine, seq, n_input, i, hasher, timer)
            size = engine.block_size
            for j, block_hash in enumerate(request.block_hashes):
                for g in engine.attention_groups | engine.mamba_groups:
                    ctx.set_offload_key_position(make_offload_key(block_hash, g),
                                                 (j + 1) * size)
            hit, keys = timer.call(host_lookup, engine, tier, ctx, request, gpu_hit, n_input)
            if keys:
                timer.call(tier.prepare_load, keys, ctx)
                timer.call(tier.complete_load, keys, ctx)
            finish_request(engine, request, seq[n_input:].tolist(), timer)
            offer = cached_keys(engine, request)
            stored = timer.call(tier.prepare_store, offer, ctx)
            if stored is None:
                refused += 1
            else:
                timer.call(tier.complete_store, stored.keys_to_store, ctx)
                stores += len(stored.keys_to_store)
                evicted += len(stored.evicted_keys)
            timer.call(tier.on_request_finished, ctx)
        except UsageError:
            raise
        except Exception as exc:
            raise RequestFailed(i, exc) from exc
        out["gpu_hit"][i], out["hit"][i] = gpu_hit, hit
        out["host_hit"][i], out["loaded"][i] = hit - gpu_hit, len(keys)
        out["micros"][i] = timer.ns / 1000.0
        progress_every(done, n, every)
    progress(n, n)
    return out, {"stores": stores, "host_evictions": evicted, "stores_refused": refused}


def run(args: argparse.Namespace, started: float) -> None:
    rest, offload = split_options(args.options)
    options = load_options(rest)
    trace = load_trace(args.trace)
    version = import_vllm()
    if not version.startswith("0.34"):
        raise UsageError(f"this worker drives vLLM 0.34's offload tier; found {version}")
    longest = int(np.diff(trace.offsets).max()) if len(trace) else 1
    engine = build_engine(options, longest + 1)
    tier = build_tier(engine, offload)
    policy = type(tier._policy)
    results, extra = replay(engine, tier, trace, options["progress_every"])
    meta = {"engine": "vllm", "version": version, "requests": len(trace),
            **engine_meta(engine), "host_chunks": tier._num_chunks,
            "policy": f"{policy.__module__}.{policy.__name__}", **extra,
            "options": options, "offload": offload,
            "seconds": round(time.perf_counter() - started, 3)}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "result.tmp.npz", **results)  # type: ignore[arg-type]
    (args.out / "result.tmp.npz").replace(args.out / "result.npz")
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    return worker_main(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
