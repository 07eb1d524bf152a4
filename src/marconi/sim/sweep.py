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

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from marconi.sim.cell import Cell, expand
from marconi.sim.oracle import oracle
from marconi.sim.pool import load_plugins, sigterm_interrupts, stop, worker_pool
from marconi.sim.progress import Progress
from marconi.sim.result import ORACLE, SimResult, ttft_seconds
from marconi.sim.results_file import ResultsFile
from marconi.sim.run import run
from marconi.sim.summary import Summary
from marconi.sim.warnings import run_warnings
from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.report import describe

LOAD_REPORT = "_load"  # a row's private key: what its trace's load kept and dropped

__all__ = ["Cell", "cell_trace", "expand", "run_cell", "run_sweep"]


@lru_cache(maxsize=2)  # traces can be GBs; cells are submitted grouped by trace
def _load(key: tuple[Any, ...]) -> Trace:
    trace, format, requests, *options = key
    loaded = load_trace(trace, format=format, options=TraceOptions(**dict(options)))
    if requests is None or requests >= len(loaded):
        return loaded
    return Trace(name=loaded.name, requests=loaded.requests[:requests], meta=loaded.meta)


def cell_trace(cell: Cell) -> Trace:
    """The cell's trace, loaded once per process for each distinct `trace_key`."""
    return _load(cell.trace_key())


def simulate_cell(cell: Cell) -> SimResult:
    """The replay of one cell, its whole result (`run_cell` keeps its summary row)."""
    config = cell.config()
    trace = cell_trace(cell)
    if cell.system == ORACLE:
        return oracle(trace, config, executor=InlineExecutor())
    return run(trace, config, warn=False)  # offline, a real engine, or a cache


def run_cell(cell: Cell, plugins: Sequence[str] = ()) -> dict[str, Any]:
    """One finished row: the cell's parameters, status, and `Summary.to_row()`.

    Never raises for a failing simulation: the row says `status = error` instead. With
    `cell.records`, the row's `_records` holds per-request arrays (not a column); its
    `_load` says what the trace's load kept and dropped. `plugins` are loaded first.
    """
    row = cell.columns()
    start = time.perf_counter()
    try:
        load_plugins(plugins)
        row[LOAD_REPORT] = describe(cell_trace(cell))
        result = simulate_cell(cell)
        row |= {"status": "ok", "error": ""} | result.summary().to_row()
        if cell.records:
            row["_records"] = {"n_input": result.records.n_input,
                               "hit": result.records.hit, "ttft_s": ttft_seconds(result)}
    except Exception as err:  # a failed cell is recorded, never fatal to the sweep
        row |= {"status": "error", "error": _error_text(err)}
    row["wall_s"] = time.perf_counter() - start
    return row


def refusal_warnings(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every finished row's `run_warnings` (its `Summary.from_row`), each naming its cell
    and trace."""
    return [f"{message} (cell {row['cell_id']}, {row['trace']})"
            for row in rows if row.get("status") == "ok"
            for message in run_warnings(Summary.from_row(row))]


def _error_text(err: Exception) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


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
              records_dir: str | Path | None = None,
              plugins: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run every cell not already `ok` in `out`; return the grid's rows in grid order.

    Mutates `out`: rewritten atomically after each finished cell, so a kill loses at
    most the cells in flight. Failed cells are retried by the next run. With no
    `executor`, a local process pool of `workers` (default: all cores) runs the cells;
    its workers never outlive this call (`sim.pool`). `plugins` (modules registering
    systems) are loaded in every worker. Each trace's load report goes to stderr once.
    """
    cells = list(cells)
    store = ResultsFile(out)
    rows = {row["cell_id"]: row for row in store.read()}
    todo = list(pending(cells, (k for k, r in rows.items() if r.get("status") == "ok")))
    todo.sort(key=lambda cell: json.dumps(cell.trace_key(), default=str))  # one trace at a time
    total = len({cell.cell_id for cell in cells})
    if progress:
        print(f"sweep: {total} cells, {total - len(todo)} done, {len(todo)} to run",
              file=sys.stderr)
    pool = executor or worker_pool(workers, plugins)
    bar = Progress(len(todo), "sweep", enabled=progress)
    try:
        with sigterm_interrupts():
            _collect(pool, todo, rows, store, bar, records_dir, tuple(plugins))
    except KeyboardInterrupt:
        if executor is None:
            stop(pool)
        raise
    finally:
        bar.close()
        if executor is None:
            pool.shutdown(cancel_futures=True)
    rows = {row["cell_id"]: row for row in store.read()}  # as stored: same columns every row
    return [rows[cell.cell_id] for cell in cells if cell.cell_id in rows]


def _collect(pool: Executor, todo: list[Cell], rows: dict[str, dict[str, Any]],
             store: ResultsFile, bar: Progress, records_dir: str | Path | None,
             plugins: tuple[str, ...]) -> None:
    """Submit every cell, then save each row as it finishes."""
    futures = {pool.submit(run_cell, cell, plugins): cell for cell in todo}
    reported: set[str] = set()
    for future in as_completed(futures):
        row = _finished(future, futures[future])
        _save_records(row.pop("_records", None), records_dir, row["cell_id"])
        report = row.pop(LOAD_REPORT, None)
        if report and report not in reported:
            reported.add(report)
            bar.write(report)
        rows[row["cell_id"]] = row
        store.write(rows.values())
        bar.update(failed=row["status"] != "ok")


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
