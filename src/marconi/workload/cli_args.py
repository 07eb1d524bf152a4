"""argparse flags for every `TraceOptions` setting, so any CLI command can expose them."""

from __future__ import annotations

import argparse

from marconi.settings import add_arguments, values_of
from marconi.workload.options import TRACE_SETTINGS, TraceOptions
from marconi.workload.registry import FORMATS
from marconi.workload.synthetic import parse_params


def add_trace_arguments(parser: argparse.ArgumentParser, *, loading: bool = True) -> None:
    """Add a "trace" argument group: `--format`, then a flag per trace setting (`--sps`,
    `--sessions`, ...: `TRACE_SETTINGS`). `loading=False` leaves out the flags about how,
    not what, to load (`--synthetic`, the trace cache): a sweep's cells carry only what
    shapes the trace."""
    g = parser.add_argument_group("trace")
    g.add_argument("--format", choices=sorted(FORMATS), default=None,
                   help="trace format (inferred from the file when omitted)")
    add_arguments(g, TRACE_SETTINGS)
    if not loading:
        return
    g.add_argument("--synthetic", default="", metavar="K=V,...",
                   help="synthetic generator parameters")
    g.add_argument("--no-trace-cache", action="store_true",
                   help="do not read or write the trace cache")
    g.add_argument("--trace-cache-dir", default=None,
                   help="trace cache directory ($MARCONI_CACHE_DIR)")


def options_from_args(args: argparse.Namespace) -> TraceOptions:
    """The `TraceOptions` the flags of `add_trace_arguments` describe (ValueError if bad)."""
    return TraceOptions(**values_of(args, TRACE_SETTINGS), params=parse_params(args.synthetic),
                        use_cache=not args.no_trace_cache, cache_dir=args.trace_cache_dir)
