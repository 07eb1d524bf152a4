"""The SGLang worker's replay of a trace: every request in order, one at a time or
overlapping as they arrive (`arrivals.run_concurrent`), each run as the scheduler runs it
(`sglang_engine.Replayer`); its per-request columns (`COLUMNS`, read off the tree and the
eviction counts), SGLang's own allocation failures as one-line usage errors, and the
scheduler's idle integrity check after each request when asked.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from marconi.engines.real.arrivals import NoRoom, Parent, run_concurrent
from marconi.engines.real.sglang_engine import Replayer, Running, max_running_requests
from marconi.engines.real.sglang_options import Trace, UsageError
from marconi.engines.real.worker_io import progress, progress_every

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
        progress_every(done, n, every)

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
    progress(n, n)
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
