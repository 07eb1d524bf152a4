"""What both workers (`sglang_worker.py`, `vllm_worker.py`) say to the process that runs
them (marconi's `worker.py`), said once: the paths a run must be given, the `progress DONE
TOTAL` lines on stderr that move its bar, the one `error: ...` line a failed run ends with,
and marconi's integration: installed when the options ask for one, closed and reported
into the meta.
Standard library only, and no marconi: it runs in the engines' environments."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any


def check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--trace`, `--options` and `--out`: all three, unless only `--version` is asked."""
    if not args.version and None in (args.trace, args.options, args.out):
        parser.error("--trace, --options and --out are required")


def progress(done: int, total: int) -> None:
    print(f"progress {done} {total}", file=sys.stderr, flush=True)


def progress_every(done: int, total: int, every: int) -> None:
    """A progress line after every `every` requests (0: none but the last); the line for
    the last request is the replay's, once it has ended."""
    if every and done % every == 0 and done < total:
        progress(done, total)


def error_line(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def install_integration(engine: str, options: dict[str, Any],
                        usage_error: type[Exception]) -> Any:
    """marconi's integration in `engine`, installed before the cache is built by the module
    the options name (`installer`: its `install_from`; its `IntegrationError` raised as
    `usage_error`); None without one."""
    wanted = options["integration"]
    if wanted is None:
        return None
    sys.path.insert(0, wanted["src"])
    installer = importlib.import_module(wanted["installer"])
    try:
        return installer.install_from(engine, wanted)
    except installer.IntegrationError as err:
        raise usage_error(str(err)) from None


def report_integration(integration: Any, extra: dict[str, Any]) -> None:
    """marconi's integration, if one was installed: its tuner closed, its report added to
    the meta's `extra` under "integration"."""
    if integration is not None:
        if integration.tuning is not None:
            integration.tuning.close()
        extra["integration"] = integration.report()
