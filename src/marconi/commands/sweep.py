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
from marconi.sim.sweep import Cell, expand, refusal_warnings, run_sweep
from marconi.workload.cli_args import add_trace_arguments

SWEEP_COLUMNS = (("trace", "trace_name", "s"), ("dataset", "dataset", "s"),
                 ("capacity", "capacity", "s"), ("model", "model", "s"), *COLUMNS)
# trace flags, named as the Cell fields they set for every cell (`--param` makes any an axis)
TRACE_FLAGS = ("format", "tokenizer", "sessions", "min_turns", "sps", "typing_wpm",
               "response_time", "mean_gap", "max_input_tokens", "collapse_observations",
               "seed", "vocab_size", "block_size", "session_field")


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run a grid of simulations (local processes or Dask)",
                       description="Run traces x systems x capacities x models x arrivals x "
                                   "tuner settings; one row per cell, resumable.")
    p.add_argument("trace", nargs="*", help="traces (files, folders, 'sharegpt', 'synthetic:..')")
    p.add_argument("--config", type=Path, help="TOML file with [[grid]] tables")
    p.add_argument("--systems", default="vllm+,sglang+,marconi", help="comma-separated")
    p.add_argument("--capacities", default="2GB", help="comma-separated sizes")
    p.add_argument("--models", default="paper-7b", help="semicolon-separated model strings")
    p.add_argument("--param", action="append", default=[], metavar="KEY=V1,V2",
                   help="any axis, trace knobs included: "
                        f"{', '.join(f.name for f in fields(Cell))}")
    p.add_argument("--out", type=Path, required=True, help="results file (.csv or .parquet)")
    p.add_argument("--records-dir", type=Path, help="where cells with records=true save them")
    add_executor_arguments(p)
    add_plugin_argument(p)
    add_trace_arguments(p, loading=False)
    p.set_defaults(func=cmd_sweep)


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    p.add_argument("--scheduler", help="Dask scheduler address (tcp://...), or 'local' to "
                                       "start a loopback LocalCluster of --workers processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_sweep(args: argparse.Namespace) -> int:
    cells = grid_from_args(args)
    preflight(args.out, args.scheduler, sorted({c.trace for c in cells}))
    try:
        with sweep_executor(args.scheduler, args.workers) as executor:
            rows = run_sweep(cells, args.out, executor=executor, workers=args.workers,
                             progress=not args.quiet, records_dir=args.records_dir,
                             plugins=args.plugin)
    except KeyboardInterrupt:
        print(f"marconi: interrupted; finished cells are kept in {args.out}: run the same "
              "command again to resume", file=sys.stderr)
        return 130
    failed = [r for r in rows if r["status"] != "ok"]
    print(table([r | {"trace_name": _short(r["trace"])} for r in rows if r["status"] == "ok"],
                SWEEP_COLUMNS))
    for warning in refusal_warnings(rows):
        print(warning, file=sys.stderr)
    for row in failed:
        print(f"cell {row['cell_id']} ({row['system']}, {row['trace']}) failed: {row['error']}",
              file=sys.stderr)
    print(f"{len(rows)} rows in {args.out}", file=sys.stderr)
    return 1 if failed else 0


def preflight(out: Path, scheduler: str | None, traces: list[str]) -> None:
    """The extras a sweep needs, checked before any cell runs."""
    if out.suffix == ".parquet":
        require("traces", "pyarrow")
    if scheduler is not None:
        require("distributed", "dask", "distributed")
    for trace in traces:
        require_for_trace(trace)


def _short(trace: str) -> str:
    """A trace as the table shows it: a path's last part, a name as given."""
    return Path(trace).name if "/" in trace else trace


def grid_from_args(args: argparse.Namespace) -> list[Cell]:
    """Cells of `--config` grids, or of the traces and axes given as flags."""
    if args.config is not None:
        with args.config.open("rb") as f:
            grids = tomllib.load(f).get("grid", [])
        return [cell for grid in grids for cell in expand(grid)]
    if not args.trace:
        raise ValueError("sweep: give at least one trace or --config")
    grid: dict[str, Any] = {"trace": list(args.trace), "system": _split(args.systems),
                            "capacity": _split(args.capacities),
                            "model": [m.strip() for m in args.models.split(";") if m.strip()]}
    grid |= {name: getattr(args, name) for name in TRACE_FLAGS}
    for item in args.param:
        key, sep, values = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r}: expected KEY=V1,V2")
        grid[key.strip()] = [coerce(key.strip(), v) for v in _split(values)]
    return expand(grid)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def coerce(name: str, text: str) -> Any:
    """A flag's text as the type of the `Cell` field `name` (`none` for optional ones)."""
    kinds = {f.name: str(f.type) for f in fields(Cell)}
    if name not in kinds:
        raise ValueError(f"unknown sweep parameter {name!r}; known: {sorted(kinds)}")
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
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0")
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
