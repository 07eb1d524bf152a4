"""Sweeps: a grid of simulator runs (cells), on any `concurrent.futures.Executor`.

```python
cells = expand({"trace": "sharegpt", "system": ["sglang+", "marconi"],
                "capacity": ["2GB", "4GB"], "sessions": 20})
rows = run_sweep(cells, Path("out/sweep.csv"))        # resumable, one row per cell
```
A cell is every parameter of one run; its id is a hash of them, so a rerun skips the
cells already in the results file. A worker loads each trace once (cached by the trace
parameters) however many cells use it. A cell that raises becomes a row with
`status = error` and the error text; the others go on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from marconi.core.spec import resolve_model
from marconi.core.units import parse_size
from marconi.sim.latency import FlopsLatency
from marconi.sim.offline import offline
from marconi.sim.oracle import oracle
from marconi.sim.replay import simulate
from marconi.sim.result import OFFLINE, ORACLE, REFERENCES, SimConfig, SimResult, ttft_seconds
from marconi.sim.results_file import ResultsFile
from marconi.systems import SYSTEMS
from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.options import DEFAULT_TOKENIZER

# summary parts left out of rows: nested, or already a cell column (system, trace, ...)
ROW_SKIP = ("hit_rate_by_input_length", "reuse_taxonomy", "system", "capacity", "trace", "model")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """Every parameter of one simulator run; `cell_id` hashes them all."""

    dataset: str = ""  # label for reports (sharegpt, swe-agent, ...); part of the id
    trace: str  # file, folder, `sharegpt` or `synthetic:NAME`, as `load_trace` takes it
    system: str  # a registered system, marconi-oracle or offline
    capacity: str  # cache bytes for KV + states: 2GB, 2GiB or an integer
    model: str = "paper-7b"  # preset with overrides, e.g. paper-7b,ssm=28,attn=7
    sessions: int | None = 100  # first N eligible sessions (paper: 100); None: all
    max_requests: int | None = None  # then keep the first N requests (Mooncake: no sessions)
    sps: float = 1.0  # sessions per second
    response_time: float = 0.0  # chat: model response time (s) before the user types
    mean_gap: float = 5.0  # agents: mean Poisson gap between calls (s)
    seed: int = 0  # arrivals and pseudo-random tokens
    tokenizer: str = DEFAULT_TOKENIZER  # text formats only
    alpha: float | None = None  # fixed alpha; None: the system's default (bootstrap)
    multiplier: int = 5  # bootstrap window multiplier (5..15)
    objective: str = "flops"  # what the tuner maximizes: flops or tokens
    records: bool = False  # also return per-request records (n_input, hit, ttft)

    def __post_init__(self) -> None:
        if self.system not in REFERENCES and self.system not in SYSTEMS:
            known = ", ".join([*SYSTEMS, *REFERENCES])
            raise ValueError(f"unknown system {self.system!r}; known systems: {known}")
        parse_size(self.capacity)
        resolve_model(self.model)
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {self.max_requests!r}")
        if self.alpha is not None and self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha!r}")
        TraceOptions(sessions=self.sessions, sessions_per_second=self.sps, seed=self.seed,
                     response_time_s=self.response_time, mean_gap_s=self.mean_gap)

    @property
    def cell_id(self) -> str:
        """A stable 16-hex id of every parameter (field order and types do not matter)."""
        text = json.dumps(self.params(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def columns(self) -> dict[str, Any]:
        """The parameters as result columns: `alpha` becomes `alpha_fixed`, since the
        summary's `alpha` is the one the run ended with."""
        out = {"cell_id": self.cell_id, **self.params()}
        out["alpha_fixed"] = out.pop("alpha")
        return out

    def trace_key(self) -> tuple[Any, ...]:
        """What shapes the trace (not the cache): cells sharing it share one load."""
        return (self.trace, self.sessions, self.max_requests, self.sps, self.response_time,
                self.mean_gap, self.seed, self.tokenizer)


def expand(grid: Mapping[str, Any]) -> list[Cell]:
    """Cells of the cartesian product of `grid` (a list value is an axis, else fixed)."""
    names = [f.name for f in fields(Cell)]
    unknown = sorted(set(grid) - set(names))
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; known: {names}")
    axes = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
    return [Cell(**dict(zip(axes, combo, strict=True)))
            for combo in itertools.product(*axes.values())]


@lru_cache(maxsize=2)  # traces can be GBs; cells are submitted grouped by trace
def _load(key: tuple[Any, ...]) -> Trace:
    trace, sessions, requests, sps, response_time, mean_gap, seed, tokenizer = key
    options = TraceOptions(sessions=sessions, sessions_per_second=sps, seed=seed,
                           response_time_s=response_time, mean_gap_s=mean_gap,
                           tokenizer=tokenizer)
    loaded = load_trace(trace, options=options)
    if requests is None or requests >= len(loaded):
        return loaded
    return Trace(name=loaded.name, requests=loaded.requests[:requests], meta=loaded.meta)


def cell_trace(cell: Cell) -> Trace:
    """The cell's trace, loaded once per process for each distinct `trace_key`."""
    return _load(cell.trace_key())


def _simulate(cell: Cell) -> SimResult:
    spec = resolve_model(cell.model)
    config = SimConfig(spec=spec, capacity=parse_size(cell.capacity), system=cell.system,
                       alpha=cell.alpha, multiplier=cell.multiplier, objective=cell.objective,
                       latency=FlopsLatency(spec))
    trace = cell_trace(cell)
    if cell.system == ORACLE:
        return oracle(trace, config, executor=InlineExecutor())
    if cell.system == OFFLINE:
        return offline(trace, config)
    return simulate(trace, config)


def run_cell(cell: Cell) -> dict[str, Any]:
    """One finished row: the cell's parameters, status, and the summary's scalars.

    Never raises for a failing simulation: the row says `status = error` instead. With
    `cell.records`, the row's `_records` holds per-request arrays (not a column).
    """
    row = cell.columns()
    start = time.perf_counter()
    try:
        result = _simulate(cell)
        row |= {"status": "ok", "error": ""} | summary_scalars(result.summary())
        if cell.records:
            row["_records"] = {"n_input": result.records.n_input,
                               "hit": result.records.hit, "ttft_s": ttft_seconds(result)}
    except Exception as err:  # a failed cell is recorded, never fatal to the sweep
        row |= {"status": "error", "error": _error_text(err)}
    row["wall_s"] = time.perf_counter() - start
    return row


def _error_text(err: Exception) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's scalar fields, with `miss_tokens` and the tuned alpha flattened."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in ROW_SKIP:
            continue
        if key == "miss_tokens":
            out |= {f"miss_{k}": int(v) for k, v in value.items()}
        elif key == "tuning":
            out["tuned_alpha"] = value.get("alpha")
            out["tuning_window"] = value.get("window")
        elif isinstance(value, str | int | float | bool | np.generic) or value is None:
            out[key] = value.item() if isinstance(value, np.generic) else value
    return out


class InlineExecutor(Executor):
    """Runs each call at submission, in this thread: a cell is one core's work."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future


def pending(cells: Iterable[Cell], done: Iterable[str]) -> Iterator[Cell]:
    """Cells not yet finished, each id once, in grid order."""
    seen = set(done)
    for cell in cells:
        if cell.cell_id not in seen:
            seen.add(cell.cell_id)
            yield cell


def run_sweep(cells: Iterable[Cell], out: str | Path, *, executor: Executor | None = None,
              workers: int | None = None, progress: bool = True,
              records_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Run every cell not already `ok` in `out`; return the grid's rows in grid order.

    Mutates `out`: rewritten atomically after each finished cell, so a kill loses at
    most the cells in flight. Failed cells are retried by the next run. With no
    `executor`, a local process pool of `workers` (default: all cores) runs the cells.
    """
    cells = list(cells)
    store = ResultsFile(out)
    rows = {row["cell_id"]: row for row in store.read()}
    todo = list(pending(cells, (k for k, r in rows.items() if r.get("status") == "ok")))
    todo.sort(key=lambda cell: json.dumps(cell.trace_key(), default=str))  # one trace at a time
    if progress:
        total = len({cell.cell_id for cell in cells})
        print(f"sweep: {total} cells, {total - len(todo)} done, {len(todo)} to run",
              file=sys.stderr)
    pool = executor or ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    try:
        futures = {pool.submit(run_cell, cell): cell for cell in todo}
        for future in tqdm(as_completed(futures), total=len(futures), desc="sweep",
                           unit="cell", disable=not progress):
            row = _finished(future, futures[future])
            _save_records(row.pop("_records", None), records_dir, row["cell_id"])
            rows[row["cell_id"]] = row
            store.write(rows.values())
    finally:
        if executor is None:
            pool.shutdown(cancel_futures=True)
    rows = {row["cell_id"]: row for row in store.read()}  # as stored: same columns every row
    return [rows[cell.cell_id] for cell in cells if cell.cell_id in rows]


def _finished(future: Future[dict[str, Any]], cell: Cell) -> dict[str, Any]:
    """The worker's row, or an error row when the worker itself failed (crash, pickling)."""
    try:
        return future.result()
    except Exception as err:
        return {**cell.columns(), "status": "error",
                "error": _error_text(err), "wall_s": None}


def _save_records(records: Mapping[str, np.ndarray] | None, folder: str | Path | None,
                  cell_id: str) -> None:
    if records is None or folder is None:
        return
    path = Path(folder) / f"{cell_id}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{cell_id}.tmp.npz")
    np.savez_compressed(tmp, **records)  # type: ignore[arg-type]
    os.replace(tmp, path)


def load_records(folder: str | Path, cell_id: str) -> dict[str, np.ndarray]:
    """Per-request records a sweep saved for a cell with `records = True`."""
    with np.load(Path(folder) / f"{cell_id}.npz") as data:
        return {k: data[k] for k in data.files}
