"""`marconi reproduce`: the paper's figures from the experiment configs shipped with the
package (`marconi/reproduction/configs/*.toml`), or from config files given."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from marconi.commands.extras import require
from marconi.commands.sweep import add_executor_arguments, sweep_executor
from marconi.sim.pool import exit_status

DATA_ENV = "MARCONI_DATA"  # default of --data


def register(sub: Any) -> None:
    p = sub.add_parser("reproduce", help="reproduce the paper's figures (PNG + tables)",
                       description="Run the experiment configs as one resumable sweep and "
                                   "draw each figure with its table.")
    p.add_argument("configs", nargs="*", type=Path,
                   help="config files or folders (default: the paper's, shipped with marconi)")
    p.add_argument("--out", type=Path, default=Path("out/reproduce"),
                   help="output folder (sweep.csv, PNGs, tables, SUMMARY.md)")
    p.add_argument("--data", type=Path, default=os.environ.get(DATA_ENV) or None,
                   help="folder holding mini-swe-agent/trajs and mooncake/*.jsonl, where "
                        f"configs' {{data}}/... traces are (${DATA_ENV}); without it those "
                        "grids are skipped with a warning")
    p.add_argument("--quick", action="store_true", help="the CI-sized subset of every grid")
    p.add_argument("--only", default="", help="comma-separated config name prefixes (fig07,...)")
    add_executor_arguments(p)
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    require("plot", "matplotlib")  # the figures come after the sweep: check before it
    if args.scheduler is not None:
        require("distributed", "dask", "distributed")
    from marconi.reproduction.config import CONFIGS, load_experiments
    from marconi.reproduction.reproduce import reproduce

    if args.data is not None and not Path(args.data).is_dir():
        raise ValueError(f"--data {args.data}: no such folder")
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    experiments = load_experiments(args.configs or [CONFIGS], only,
                                   data=None if args.data is None else Path(args.data))
    args.out.mkdir(parents=True, exist_ok=True)
    print("reproduce: the paper's figures under its own protocol, the sequential replay (each "
          "request committed before the next is looked up; a grid may name replay = "
          "\"serving\"); docs/architecture.md, \"Replay protocols\"", file=sys.stderr)
    try:
        with sweep_executor(args.scheduler, args.workers) as executor:
            outcome = reproduce(experiments, args.out, quick=args.quick, executor=executor,
                                workers=args.workers, progress=not args.quiet)
    except KeyboardInterrupt as interrupt:
        print(f"marconi: interrupted; finished cells are kept in {args.out}: run the same "
              "command again to resume", file=sys.stderr)
        return exit_status(interrupt)
    print(outcome.summary.read_text())
    figures, failed = len(outcome.figures), outcome.failed_cells
    print(f"reproduce: {figures} figure{'' if figures == 1 else 's'} in {args.out} "
          f"({outcome.seconds:.0f} s, {failed} failed cell{'' if failed == 1 else 's'})",
          file=sys.stderr)
    return 1 if outcome.failed_cells else 0
