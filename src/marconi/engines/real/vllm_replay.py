"""The vLLM worker's replay of a trace: every request in arrival order, one at a time or
overlapping as they arrive (`arrivals.run_concurrent`), each run as the scheduler runs it
(`vllm_scheduler.py`); its per-request columns (`COLUMNS`), counted by a probe on the
block pool (`PoolProbe`), and the pool's integrity checked after each request when asked.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engines.real.arrivals import NoRoom, Parent, run_concurrent
from marconi.engines.real.vllm_engine import Engine, import_vllm
from marconi.engines.real.vllm_options import Trace, UsageError
from marconi.engines.real.vllm_scheduler import (
    PoolTooSmall,
    Timer,
    finish_request,
    held_blocks,
    run_request,
    start_request,
)
from marconi.engines.real.worker_io import check_paths, error_line, progress, progress_every


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
    for key, block in cached_entries(pool):
        assert block.block_hash == key or key in pool.cached_block_hashes_by_block.get(
            block.block_id, ()), "hash map entry not held by its block"
    scan = {b.block_id: int.from_bytes(b.block_hash[-4:], "big") for b in pool.blocks
            if b.block_hash is not None}
    assert scan == probe.hashed, "incremental hashed-block map drifted"
    assert +probe.per_group == Counter(scan.values()), "per-group counts drifted"
    for mgr in engine.manager.coordinator.single_type_managers:
        assert not mgr.req_to_blocks, "a manager still tracks a freed request"


def cached_entries(pool: Any) -> list[tuple[Any, Any]]:
    """Every (hash key, block) of the pool's hash map. Up to 0.33 the map's dict holds a
    block, or a dict of blocks by id, per key; from 0.34 a block id per key, with the ids
    of keys held by several blocks kept apart (`_dup_ids`)."""
    the_map = pool.cached_block_hash_to_block
    out: list[tuple[Any, Any]] = []
    for key, entry in the_map._cache.items():
        if isinstance(entry, int):  # 0.34
            ids = the_map._dup_ids.get(key, {entry: None})
            out.extend((key, pool.blocks[i]) for i in ids)
        else:
            out.extend((key, b) for b in (entry.values() if isinstance(entry, dict)
                                          else (entry,)))
    return out


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
            progress_every(done, len(trace), every)
    progress(len(trace), len(trace))
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
        progress_every(done, len(trace), every)

    def idle() -> None:
        if options["check"]:
            check_request(engine, probe, last[0])

    try:
        schedule = run_concurrent(
            trace.order.tolist(), trace.arrival.tolist(),
            (np.diff(trace.offsets) - trace.n_input).tolist(),
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


def worker_main(description: str, run: Callable[[argparse.Namespace, float], None],
                argv: list[str] | None) -> int:
    """A vLLM worker's command line (`vllm_worker.py`, `vllm_offload_worker.py`): `--trace`,
    `--options`, `--out` run `run(args, started)`; `--version` prints vLLM's version. The
    contract with marconi's `worker.py`: a usage error is one error line and exit 2; any
    other failure a traceback, then one error line, exit 1."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--version", action="store_true",
                        help="load vLLM, print its version and exit (the setup's check)")
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--options", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    check_paths(parser, args)
    try:
        if args.version:
            print(f"vllm {import_vllm()}")
            return 0
        run(args, time.perf_counter())
    except UsageError as exc:
        error_line(str(exc))
        return 2
    except Exception as exc:
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        where = "" if isinstance(exc, RequestFailed) else f"setup: {type(exc).__name__}: "
        error_line(f"{where}{exc}")
        return 1
    return 0
