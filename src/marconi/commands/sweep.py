"""`marconi sweep`: a grid of runs on local processes or a Dask cluster.

```
marconi sweep sharegpt --systems sglang+,marconi --capacities 2GB,4GB --param sps=0.5,1 \\
    --out out/sweep.csv [--workers 2 | --scheduler tcp://host:8786 | --scheduler local]
```
Workers of a remote cluster must run with `DASK_DISTRIBUTED__WORKER__DAEMON=False` (the
bootstrap tuner starts its own replay processes) and see the same trace paths.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from marconi.commands.extras import require, require_for_trace
from marconi.commands.parsing import add_plugin_argument
from marconi.report.table import COLUMNS, table
from marconi.settings import DEFAULT, add_arguments
from marconi.sim.cell import NAMES
from marconi.sim.config import SETTINGS
from marconi.sim.pool import exit_status
from marconi.sim.result import REPLAY_SETTINGS
from marconi.sim.summary import Summary, gap_to_none
from marconi.sim.sweep import Cell, expand, refusal_warnings, run_sweep
from marconi.systems import split_systems
from marconi.workload.cli_args import add_trace_arguments
from marconi.workload.registry import check_settings, trace_format

SWEEP_COLUMNS = (("trace", "trace_name", "s"), ("dataset", "dataset", "s"),
                 ("capacity", "capacity", "s"), ("model", "model", "s"), *COLUMNS)
# flags that set a parameter of every cell (`--param` makes any an axis): the trace
# format, and every run setting, each named as the parameter it sets
SETTING_FLAGS = ("format", *SETTINGS)


GRID_FLAGS = ("systems", "capacities", "models")


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run a grid of simulations (local processes or Dask)",
                       description="Run traces x systems x capacities x models x arrivals x "
                                   "tuner settings; one row per cell, resumable.")
    p.add_argument("trace", nargs="*", help="traces (files, folders, 'sharegpt', 'synthetic:..')")
    p.add_argument("--config", type=Path, help="TOML file with [[grid]] tables")
    p.add_argument("--systems", default="vllm+,sglang+,marconi", help="comma-separated")
    p.add_argument("--capacities", default=DEFAULT.capacity, help="comma-separated sizes")
    p.add_argument("--models", default=DEFAULT.model, help="semicolon-separated model strings")
    p.add_argument("--param", action="append", default=[], metavar="KEY=V1,V2",
                   help=f"any parameter as an axis: {', '.join(sorted(NAMES))}")
    p.add_argument("--out", type=Path, required=True, help="results file (.csv or .parquet)")
    p.add_argument("--records-dir", type=Path, help="where cells with records=true save them")
    add_executor_arguments(p)
    add_plugin_argument(p)
    add_trace_arguments(p, loading=False)
    add_arguments(p.add_argument_group("replay"), REPLAY_SETTINGS)
    # what a grid flag is when not given: with --config, any other value was given
    p.set_defaults(func=cmd_sweep, grid_defaults={name: p.get_default(name) for name in
                                                  (*GRID_FLAGS, *SETTING_FLAGS)})


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    p.add_argument("--scheduler", help="Dask scheduler address (tcp://...), or 'local' to "
                                       "start a loopback LocalCluster of --workers processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_sweep(args: argparse.Namespace) -> int:
    cells = grid_from_args(args)
    _check_settings(cells)
    preflight(args.out, args.scheduler, sorted({c.trace for c in cells}))
    try:
        with sweep_executor(args.scheduler, args.workers) as executor:
            rows = run_sweep(cells, args.out, executor=executor, workers=args.workers,
                             progress=not args.quiet, records_dir=args.records_dir,
                             plugins=args.plugin)
    except KeyboardInterrupt as interrupt:
        print(f"marconi: interrupted; finished cells are kept in {args.out}: run the same "
              "command again to resume", file=sys.stderr)
        return exit_status(interrupt)
    failed = [r for r in rows if r["status"] != "ok"]
    print(sweep_table([r for r in rows if r["status"] == "ok"]))
    for warning in refusal_warnings(rows):
        print(warning, file=sys.stderr)
    for row in failed:
        print(f"cell {row['cell_id']} ({row['system']}, {row['trace']}) failed: {row['error']}",
              file=sys.stderr)
    print(f"{len(rows)} rows in {args.out}", file=sys.stderr)
    return 1 if failed else 0


def _check_settings(cells: list[Cell]) -> None:
    """Refuse, before any cell runs, a trace setting its trace's format does not use (a
    `--param min_turns=1,4` over a synthetic trace gives identical rows)."""
    seen = set()
    for cell in cells:
        options = cell.trace_options()
        key = (cell.trace, cell.format, repr(options))
        if key in seen:
            continue
        seen.add(key)
        try:
            fmt = trace_format(cell.trace, cell.format)
        except (OSError, ValueError):  # a trace that cannot be read: its cells say why
            continue
        check_settings(cell.trace, fmt, options)


def preflight(out: Path, scheduler: str | None, traces: list[str]) -> None:
    """The extras a sweep needs, checked before any cell runs."""
    if out.suffix == ".parquet":
        require("traces", "pyarrow")
    if scheduler is not None:
        require("distributed", "dask", "distributed")
    for trace in traces:
        require_for_trace(trace)


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The finished rows as a table: trace, dataset (if any), capacity, model, then a column for
    every other parameter that varies across them (so that no two rows look alike), then
    the figures."""
    names = trace_names(sorted({str(r["trace"]) for r in rows}))
    # "alpha" is the figure column (the alpha in force); the axis is `alpha_fixed`
    shown = {"trace", "dataset", "capacity", "model", "system", "records", "cell_id", "alpha"}
    varying = [key for key in rows[0] if key not in shown and key in _PARAMS
               and len({repr(r.get(key)) for r in rows}) > 1] if rows else []
    head = [c for c in SWEEP_COLUMNS[:4]  # a dataset column only where some row has one
            if c[1] != "dataset" or any(gap_to_none(r.get("dataset")) is not None for r in rows)]
    columns = (*head, *((key, key, "") for key in varying), *SWEEP_COLUMNS[4:])
    return table([Summary.from_row(r) for r in rows], columns,
                 context=[r | {"trace_name": names[str(r["trace"])]} for r in rows])


_PARAMS = {*NAMES, "alpha_fixed"}


def trace_names(traces: list[str]) -> dict[str, str]:
    """Each trace as the table shows it: a path's last part, a name as given; paths whose
    last parts collide, relative to the folder they share."""
    short = {t: Path(t).name if "/" in t else t for t in traces}
    for name in set(short.values()):
        same = [t for t in traces if short[t] == name]
        if len(same) > 1 and all("/" in t for t in same):
            root = os.path.commonpath([str(Path(t).resolve()) for t in same])
            short |= {t: os.path.relpath(Path(t).resolve(), root) for t in same}
    return short


def grid_from_args(args: argparse.Namespace) -> list[Cell]:
    """Cells of `--config` grids, or of the traces and axes given as flags."""
    if args.config is not None:
        given = [f"--{n.replace('_', '-')}" for n, default in args.grid_defaults.items()
                 if getattr(args, n) != default]
        given += ["--param"] * bool(args.param) + ["trace arguments"] * bool(args.trace)
        if given:
            raise ValueError(f"sweep: --config {args.config} defines the whole grid; "
                             f"{', '.join(given)} would be ignored: put them in its "
                             "[[grid]] tables, or drop --config")
        with args.config.open("rb") as f:
            grids = tomllib.load(f).get("grid", [])
        return [cell for grid in grids for cell in expand(grid)]
    if not args.trace:
        raise ValueError("sweep: give at least one trace or --config")
    grid: dict[str, Any] = {"trace": list(args.trace), "system": split_systems(args.systems),
                            "capacity": _split(args.capacities),
                            "model": [m.strip() for m in args.models.split(";") if m.strip()]}
    grid |= {name: getattr(args, name) for name in SETTING_FLAGS}
    for item in args.param:
        key, sep, values = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r}: expected KEY=V1,V2")
        grid[key.strip()] = [coerce(key.strip(), v) for v in _split(values)]
    return expand(grid)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def coerce(name: str, text: str) -> Any:
    """A `--param` value's text as the parameter `name` takes it (`none` for optional
    ones); ValueError naming the parameter and what it accepts."""
    if name in SETTINGS:
        try:
            return SETTINGS[name].parse(text)
        except ValueError as err:
            raise ValueError(f"--param {err}") from None
    kinds = {f.name: str(f.type) for f in fields(Cell)}
    if name not in NAMES:
        raise ValueError(f"unknown sweep parameter {name!r}; known: {sorted(NAMES)}")
    kind = kinds[name]
    if "None" in kind and text.lower() in ("none", "all"):
        return None
    if kind.startswith("bool"):
        return text.lower() in ("1", "true", "yes")
    for word, cast in (("int", int), ("float", float)):
        if kind.startswith(word):
            try:
                return cast(text)
            except ValueError:
                raise ValueError(f"--param {name}: {text!r} is not {kind}") from None
    return text


@contextmanager
def sweep_executor(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """None (local processes), a Dask cluster's executor, or a fresh loopback cluster's.
    Prints the Dask dashboard's address on stderr."""
    if scheduler is None:
        yield None
        return
    require("distributed", "dask", "distributed")
    import dask
    from distributed import Client

    # workers must not be daemons: the bootstrap tuner forks its own replay processes
    with dask.config.set({"distributed.worker.daemon": False}):
        if scheduler != "local":
            with Client(scheduler) as client:
                _dashboard(client)
                yield client.get_executor()
            return
        with _local_cluster(workers or 2) as cluster, Client(cluster) as client:
            _dashboard(client)
            yield client.get_executor()


@contextmanager
def _local_cluster(workers: int) -> Iterator[Any]:
    """A loopback cluster whose processes ignore Ctrl-C (the sweep handles it): they are
    started with SIGINT ignored, which a new interpreter keeps."""
    from distributed import LocalCluster

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # silence_logs: the workers' own logs stay out of the user's terminal: warnings
        # for tasks a Ctrl-C cancels, and errors with tracebacks from the teardown's races
        # (a worker's heartbeat to a scheduler already closed). The sweep reports every
        # failure itself: a cell's error in its row, a lost worker, the interrupt's line.
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                               silence_logs=logging.CRITICAL)
    finally:
        signal.signal(signal.SIGINT, previous)
    with cluster:
        yield cluster


def _dashboard(client: Any) -> None:
    link = getattr(client, "dashboard_link", None)
    if link and importlib.util.find_spec("bokeh") is not None:
        print(f"sweep: Dask dashboard at {link}", file=sys.stderr)
    else:
        print("sweep: no Dask dashboard (it needs bokeh: pip install 'marconi[distributed]')",
              file=sys.stderr)
