"""Replay a trace through SGLang 0.5.23's real prefix cache, as its scheduler drives it.

What runs is SGLang's own code: `UnifiedRadixCache` (Full + Mamba components, the Python or
the Rust tree core) over `HybridReqToTokenPool` (request rows + the Mamba slot pool) and a
`HybridLinearKVPool` token allocator, driven per request through the scheduler's own steps.
This file is the worker's entry point (the arguments, marconi's integration when asked, the
wiring, the files written); the files beside it, imported by name, do the rest:

- `sglang_options.py`: the options (`REQUIRED`, `DEFAULTS`) and the trace, checked;
  `UsageError`;
- `sglang_load.py`: SGLang loaded without a GPU, its version checked;
- `sglang_engine.py`: its cache and pools built, and one request run through them as the
  scheduler runs it, step by step;
- `sglang_replay.py`: every request of the trace, one at a time or as they arrive
  (`arrivals.py`), and the columns of `result.npz`;
- `worker_io.py`: the progress and error lines both workers print.

    python -P -m marconi.engines.real.sglang_worker --trace T.npz --options O.json --out DIR
    python -P -m marconi.engines.real.sglang_worker --version

Writes DIR/result.npz (per request: hit, kv_tokens, states, evicted_kv, evicted_states,
micros) and DIR/meta.json; prints `progress DONE TOTAL` on stderr. A failure ends with one
line `error: ...` on stderr: exit 2 for bad options, a wrong SGLang version or a request the
pools cannot hold; exit 1 for anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engines.real.sglang_engine import Replayer
from marconi.engines.real.sglang_load import check_version, load_sglang
from marconi.engines.real.sglang_options import Trace, UsageError, read_options
from marconi.engines.real.sglang_replay import RequestFailed, replay
from marconi.engines.real.worker_io import (
    check_paths,
    error_line,
    install_integration,
    report_integration,
)

# --- command line -----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trace", type=Path, help="the trace (.npz)")
    parser.add_argument("--options", type=Path, help="the options (.json)")
    parser.add_argument("--out", type=Path, help="folder for result.npz and meta.json")
    parser.add_argument("--version", action="store_true",
                        help="load the engine, print its version and exit")
    args = parser.parse_args(argv)
    check_paths(parser, args)
    return args


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
    integration = install_integration("sglang", opts, UsageError)
    replayer = Replayer(sgl, opts, trace.max_len())
    columns, extra = replay(replayer, trace, opts)
    report_integration(integration, extra)
    meta = {"engine": "sglang", "version": version, "requests": len(trace),
            "options": opts, "seconds": time.perf_counter() - start, **extra}
    write_result(args.out, columns, meta)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run_worker(args)
    except UsageError as err:
        error_line(str(err))
        return 2
    except RequestFailed as err:
        traceback.print_exception(err.cause)
        error_line(str(err))
        return 1
    except Exception as err:  # any failure ends in one line
        traceback.print_exc()
        error_line(f"setup: {type(err).__name__}: {' '.join(str(err).split())}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
