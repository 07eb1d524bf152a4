"""`marconi`: simulate, compare, analyze traces; sweep, reproduce, engine-bench, serve.

Every subcommand registers itself (`_register_*`) and sets `func`; errors in user input
end as one line `marconi: error: ...` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marconi import __version__
from marconi.api import write_records
from marconi.commands.extras import require, require_for_trace
from marconi.commands.parsing import Parser, add_plugin_argument, load_plugins, warn_alpha
from marconi.core.layout import Layout
from marconi.core.spec import ModelSpec, model_from
from marconi.core.units import parse_size
from marconi.report.table import experts, table
from marconi.settings import RUN, add_arguments, argument_type, nearest, values_of
from marconi.sim.config import configure
from marconi.sim.replay import describe_replay
from marconi.sim.result import REFERENCES, REPLAY_SETTINGS, SimConfig
from marconi.sim.run import check_reference, run
from marconi.sim.summary import Summary
from marconi.systems import SYSTEMS, get_system, split_systems
from marconi.workload import Trace, TraceOptions, load_trace, summarize
from marconi.workload.cli_args import add_trace_arguments, options_from_args
from marconi.workload.registry import check_settings
from marconi.workload.report import describe

DEFAULT_COMPARE = "vanilla,vllm+,sglang+,marconi"


def _system_names() -> list[str]:
    return [*SYSTEMS, *REFERENCES]


def system_name(text: str) -> str:
    """A registered system (with its options, `sglang-2026:strategy=extra_buffer`) or a
    reference, canonically named; ValueError naming what is wrong."""
    text = text.strip()
    if text in REFERENCES:
        return text
    base = text.partition(":")[0]
    if base not in SYSTEMS:
        names = _system_names()
        raise ValueError(f"unknown system {text!r}{nearest(base, names)}; known systems: "
                         f"{', '.join(names)} (or load your own with --plugin)")
    return get_system(text).name


def _system_arg(text: str) -> str:
    try:
        return system_name(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _size_arg(text: str) -> str:
    """A size as given (`2GB`), checked here so that the error names the flag."""
    try:
        parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _add_cache_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="trace file or folder, 'sharegpt', or 'synthetic:NAME[:k=v]'")
    p.add_argument("--model", default=RUN["model"].default, help=RUN["model"].help)
    p.add_argument("--capacity", default=RUN["capacity"].default, type=_size_arg,
                   help=RUN["capacity"].help)
    add_arguments(p.add_argument_group("replay"), REPLAY_SETTINGS)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_plugin_argument(p)
    add_trace_arguments(p)


def _register_simulate(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay a trace through one system",
                       description="Replay a trace through one caching system.")
    _add_cache_arguments(p)
    p.add_argument("--system", default=RUN["system"].default, type=_system_arg,
                   metavar="SYSTEM[:K=V,...]",
                   help="the caching system to replay (README: what each one does), with "
                        "its options where it has them (docs/peers.md); one of: "
                        f"{', '.join(_system_names())}")
    alpha = p.add_mutually_exclusive_group()
    alpha.add_argument("--alpha", type=argument_type(RUN["alpha"]), help=RUN["alpha"].help)
    alpha.add_argument("--tune", action="store_true", help="bootstrap-tune alpha (default)")
    p.add_argument("--records", type=Path, help="write per-request records (.csv or .parquet)")
    p.set_defaults(func=cmd_simulate)


def _register_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="replay a trace through several systems: table + PNG",
                       description="Replay one trace through several systems.")
    _add_cache_arguments(p)
    p.add_argument("--systems", default=DEFAULT_COMPARE,
                   help="comma-separated (options after a colon, ';' between systems that "
                        f"have them), from: {', '.join(_system_names())}")
    p.add_argument("--plot", type=Path, help="write a figure comparing the systems "
                   "(.png, .pdf, .svg, ...: any file type matplotlib writes)")
    p.add_argument("--seeds", type=int, default=1, metavar="K",
                   help="replay under K seeds (--seed, --seed + 1, ...), each redrawing "
                        "the trace's random choices: arrival gaps, and for a synthetic "
                        "trace its content too (each seed a new trace of the same shape); "
                        "each system's mean, and its paired margin over the first system "
                        "with a 95%% confidence interval (agent and synthetic traces; chat "
                        "turns arrive by the typing model, and trace timestamps are fixed)")
    p.set_defaults(func=cmd_compare)


def _register_analyze(sub: Any) -> None:
    p = sub.add_parser("analyze", help="a trace's reuse taxonomy and infinite-cache bound",
                       description="How much of a trace's input could any cache reuse?")
    p.add_argument("trace", help="trace file or folder, 'sharegpt', or 'synthetic:NAME[:k=v]'")
    p.add_argument("--model", default=RUN["model"].default,
                   help=f"the model, for FLOPs: {RUN['model'].help}")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    add_trace_arguments(p)
    p.set_defaults(func=cmd_analyze)


def _model(text: str) -> ModelSpec:
    return model_from(text)


def _trace(args: argparse.Namespace, options: TraceOptions | None = None) -> Trace:
    """Load the trace and say on stderr what was kept and what each filter dropped; a
    trace setting its format does not use is refused first (`check_settings`)."""
    given = options_from_args(args)
    check_settings(args.trace, args.format, given)  # `compare --seeds` varies the seed alone
    options = options or given
    trace = load_trace(args.trace, format=args.format, options=options)
    print(describe(trace), file=sys.stderr)
    return trace


def _config(args: argparse.Namespace, system: str, alpha: float | None) -> SimConfig:
    return configure(model=args.model, capacity=args.capacity, system=system, alpha=alpha,
                     **values_of(args, REPLAY_SETTINGS))


def _say_layout(config: SimConfig) -> None:
    """On stderr, the memory layout of a run that is not the single byte budget (a peer's
    engine layout by default): its figures are not comparable to the paper's otherwise."""
    layout = config.layout
    if layout != Layout():
        print(f"layout: {config.system} runs {layout.in_words()} "
              "(--page-size 1 --state-slots 0: the single byte budget)", file=sys.stderr)


def _preflight(args: argparse.Namespace, systems: Sequence[str]) -> None:
    """Every check that needs no replay, before the first one starts: extras, output
    paths, the capacity against the model, a real engine's environment."""
    require_for_trace(args.trace, args.format)
    engines = [e for s in systems if s not in REFERENCES
               and (e := get_system(s).engine) is not None]
    if engines:
        from marconi.engine_flags import ENGINES
        from marconi.engines.real.envs import python_of

        for engine in engines:
            python_of(ENGINES[engine])
    if getattr(args, "plot", None) is not None:
        require("plot", "matplotlib")
        from marconi.report.plot import check_plot_path

        check_plot_path(args.plot)
    records = getattr(args, "records", None)
    if records is not None and records.suffix not in (".csv", ".parquet"):
        raise ValueError(f"--records: {records} must end in .csv or .parquet")
    if records is not None and records.suffix == ".parquet":
        require("traces", "pyarrow")
    for system in systems:
        config = _config(args, system, None)
        check_reference(config)
        if config.replay == "serving" and system not in REFERENCES \
                and get_system(system).engine is not None:
            raise ValueError(f"{system} replays through the engine's own code with its own "
                             "schedule, not the serving replay: give --replay sequential "
                             "(--concurrent: the engine's overlap schedule)")
        _say_layout(config)


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.alpha is not None and args.system not in REFERENCES \
            and not get_system(args.system).uses_alpha:
        raise ValueError(f"--alpha: system {args.system!r} has no alpha")
    warn_alpha(args.alpha)
    _preflight(args, [args.system])
    config = _config(args, args.system, args.alpha)
    result = run(_trace(args), config, progress=not args.quiet)
    summary = result.summary()
    if args.records is not None:
        write_records(result, args.records)
    print(json.dumps(summary.to_json(), indent=2) if args.json else
          f"{describe_replay(config)}\n{_with_experts([summary])}")
    return 0


def _with_experts(summaries: list[Summary]) -> str:
    """The table, then marconi+'s experts beside each marconi+ run."""
    below = experts(summaries)
    return table(summaries) + (f"\n{below}" if below else "")


def cmd_compare(args: argparse.Namespace) -> int:
    names = [system_name(s) for s in split_systems(args.systems)]
    if not names:
        raise ValueError(f"--systems: none given; known: {', '.join(_system_names())}")
    _preflight(args, names)
    if args.seeds != 1:
        return _compare_seeds(args, names)
    trace = _trace(args)
    summaries = [run(trace, _config(args, name, None), progress=not args.quiet).summary()
                 for name in names]
    if args.json:
        print(json.dumps([s.to_json() for s in summaries], indent=2))
    else:
        print(f"{trace.name}: {len(trace)} requests, {trace.input_tokens} input tokens, "
              f"model {args.model}, capacity {args.capacity}")
        print(describe_replay(_config(args, names[0], None)))
        print(_with_experts(summaries))
    if args.plot is not None:
        from marconi.report.plot import compare_plot

        out = compare_plot([s.to_json() for s in summaries], args.plot,
                           f"{trace.name} | {args.model} | {args.capacity} | "
                           f"{_config(args, names[0], None).replay} replay")
        print(f"plot written to {out}", file=sys.stderr)
    return 0


def _compare_seeds(args: argparse.Namespace, names: list[str]) -> int:
    """`compare --seeds K`: which system is better on average, not on one lucky draw."""
    from marconi.report.seeds import SeedComparison

    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (1 replays once), got {args.seeds}")
    base = options_from_args(args)
    comparison = SeedComparison(names)
    for k in range(args.seeds):
        trace = _trace(args, dataclasses.replace(base, seed=base.seed + k))
        for name in names:
            result = run(trace, _config(args, name, None), progress=not args.quiet)
            comparison.add(base.seed + k, result.summary())
        if not args.quiet:
            print(f"seed {base.seed + k} done ({k + 1} of {args.seeds})", file=sys.stderr)
    if args.json:
        print(json.dumps(comparison.to_json(), indent=2))
    else:
        print(f"{trace.name}: model {args.model}, capacity {args.capacity}, "
              f"seeds {base.seed}-{base.seed + args.seeds - 1}")
        print(comparison.table())
    if args.plot is not None:
        from marconi.report.plot import compare_plot

        out = compare_plot(comparison.mean_rows(), args.plot,
                           f"{trace.name} | {args.model} | {args.capacity} | "
                           f"mean of {args.seeds} seeds (bars: min-max)",
                           spread=comparison.spread())
        print(f"plot written to {out}", file=sys.stderr)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from marconi.sim.analyze import analyze

    require_for_trace(args.trace, args.format)
    trace = _trace(args)
    report = analyze(trace, _model(args.model)) | {"trace_summary": summarize(trace)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_analysis(report))
    return 0


def format_analysis(report: dict[str, Any]) -> str:
    total = max(report["input_tokens"], 1)
    lines = [f"{report['trace']}: {report['requests']} requests, {report['input_tokens']} "
             "input tokens", "reuse taxonomy (share of input tokens):"]
    for key, value in report["reuse_taxonomy"].items():
        lines.append(f"  {key.replace('_', ' '):18} {value:>12}  {100 * value / total:5.1f}%")
    lines.append(f"infinite-cache bound: token hit rate {100 * report['bound_token_hit_rate']:.1f}%"
                 f", FLOPs saved {100 * report['bound_flops_saved_rate']:.1f}%")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="marconi", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"marconi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for register in (_register_simulate, _register_compare, _register_analyze):
        register(sub)
    from marconi.commands.reproduce import register as register_reproduce
    from marconi.commands.sweep import register as register_sweep

    register_sweep(sub)
    register_reproduce(sub)
    _register_optional(sub)
    return p


def _register_optional(sub: Any) -> None:
    """Commands whose extras (torch, fastapi) may not be installed: they say which extra
    to install when run."""
    from marconi.commands.engine_bench import register as register_engine_bench
    from marconi.commands.serve import register as register_serve

    register_engine_bench(sub)
    register_serve(sub)


def overview(p: argparse.ArgumentParser) -> str:
    """What a bare `marconi` prints: each command with its one line."""
    rows = [(c.dest, c.help or "") for a in p._actions
            if isinstance(a, argparse._SubParsersAction) for c in a._choices_actions]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"marconi {__version__}: {__doc__.splitlines()[0].split(': ', 1)[1]}",
                      "usage: marconi COMMAND [options]   (marconi COMMAND --help: its options)",
                      "commands:", *(f"  {name:<{width}}  {text}" for name, text in rows)])


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(overview(parser()))
        return 0
    try:
        plugins = load_plugins(argv)  # before the parser lists the systems
    except (ValueError, ImportError) as err:
        print(f"marconi: error: {err}", file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    args.plugin = plugins
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as err:
        print(f"marconi: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("marconi: interrupted", file=sys.stderr)
        return 130
