"""`marconi reproduce`: the paper's figures from `experiments/*.toml`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from marconi.commands.sweep import add_executor_arguments, sweep_executor


def register(sub: Any) -> None:
    p = sub.add_parser("reproduce", help="reproduce the paper's figures (PNG + tables)",
                       description="Run the experiment configs as one resumable sweep and "
                                   "draw each figure with its table.")
    p.add_argument("configs", nargs="*", type=Path,
                   help="config files or folders (default: ./experiments)")
    p.add_argument("--out", type=Path, default=Path("experiments/results"),
                   help="output folder (sweep.csv, PNGs, tables, SUMMARY.md)")
    p.add_argument("--quick", action="store_true", help="the CI-sized subset of every grid")
    p.add_argument("--only", default="", help="comma-separated config name prefixes (fig07,...)")
    add_executor_arguments(p)
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from marconi.experiments.config import load_experiments
    from marconi.experiments.reproduce import reproduce

    only = [o.strip() for o in args.only.split(",") if o.strip()]
    experiments = load_experiments(args.configs or [Path("experiments")], only)
    args.out.mkdir(parents=True, exist_ok=True)
    with sweep_executor(args.scheduler, args.workers) as executor:
        outcome = reproduce(experiments, args.out, quick=args.quick, executor=executor,
                            workers=args.workers, progress=not args.quiet)
    print(outcome.summary.read_text())
    print(f"reproduce: {len(outcome.figures)} figures in {args.out} ({outcome.seconds:.0f} s, "
          f"{outcome.failed_cells} failed cells)", file=sys.stderr)
    return 1 if outcome.failed_cells else 0
