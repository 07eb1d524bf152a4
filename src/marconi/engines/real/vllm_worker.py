"""Replay a request trace through vLLM 0.32's real prefix cache (hybrid attention + Mamba).

Drives vLLM's own `KVCacheManager` (its `HybridKVCacheCoordinator`, `BlockPool`,
`FullAttentionManager` and `MambaManager` in `mamba_cache_mode="align"`), not an emulation,
so that `marconi.peers.mamba_align` can be checked against the real thing. No model runs:
the worker plays the scheduler's part around the cache. This file is its entry point (the
arguments, marconi's integration when asked, the wiring, the files written); the files
beside it, imported by name, do the rest:

- `vllm_options.py`: the options (`OPTION_RULES`) and the trace, checked; `UsageError`;
- `vllm_engine.py`: vLLM imported and its cache built as vLLM builds it;
- `vllm_scheduler.py`: one request as the scheduler runs it, step by step;
- `vllm_replay.py`: every request of the trace, one at a time or as they arrive
  (`arrivals.py`), and the columns of `result.npz`;
- `worker_io.py`: the progress and error lines both workers print.

Usage (in a virtualenv holding vllm 0.32, torch and numpy; marconi is not needed)::

    python -P -m marconi.engines.real.vllm_worker --trace TRACE.npz --options OPTIONS.json --out DIR

TRACE.npz: `tokens` int32 (every request's input then output), `offsets` int64 (n+1),
`n_input` int64 (n), `arrival` float64 (n; requests are replayed in this order).
OPTIONS.json: see `vllm_options.OPTION_RULES`. DIR receives `result.npz` (per request, after it:
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
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engines.real.vllm_engine import build_engine, engine_meta, import_vllm
from marconi.engines.real.vllm_options import UsageError, load_options, load_trace
from marconi.engines.real.vllm_replay import replay, worker_main
from marconi.engines.real.worker_io import install_integration, report_integration


def write_outputs(out_dir: Path, results: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write to temporary names, then rename, so a reader never sees half a result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_npz, tmp_json = out_dir / "result.tmp.npz", out_dir / "meta.json.tmp"
    columns: dict[str, Any] = dict(results)  # (numpy's stub types **kwds as allow_pickle)
    np.savez(tmp_npz, **columns)
    tmp_json.write_text(json.dumps(meta, indent=2) + "\n")
    tmp_npz.replace(out_dir / "result.npz")
    tmp_json.replace(out_dir / "meta.json")


def run(args: argparse.Namespace, started: float) -> None:
    options = load_options(args.options)
    trace = load_trace(args.trace)
    version = import_vllm()
    integration = install_integration("vllm", options, UsageError)
    if integration is not None and options["check"]:  # every victim checked the plain way
        integration.order.check = True
    longest = int(np.diff(trace.offsets).max()) if len(trace) else 1
    engine = build_engine(options, longest + 1)  # max_model_len: never the limit
    replay_start = time.perf_counter()
    results, extra = replay(engine, trace, options)
    done = time.perf_counter()
    report_integration(integration, extra)
    meta = {"engine": "vllm", "version": version, "requests": len(trace),
            **engine_meta(engine), **extra, "options": options,
            "seconds": round(done - started, 3),
            "replay_seconds": round(done - replay_start, 3)}
    write_outputs(args.out, results, meta)


def main(argv: list[str] | None = None) -> int:
    return worker_main(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
