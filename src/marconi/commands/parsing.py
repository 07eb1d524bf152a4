"""What every `marconi` command shares: help that shows defaults, and `--plugin`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _hidden(default: Any) -> bool:
    """Defaults not worth showing: none, a flag's False, suppressed, empty (0 and 0.0 are
    shown: they are values, and `0 == False`)."""
    return default is None or default is False or default is argparse.SUPPRESS \
        or default == "" or default == []


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to every option that has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default: Any = action.default
        if "%(default)" in text or not action.option_strings or _hidden(default):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults; subcommands inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def add_plugin_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import a module (or .py file) that registers systems with "
                        "@marconi.systems.system, so they can be named; repeatable")


def load_plugins(argv: Sequence[str]) -> list[str]:
    """Import every `--plugin` in `argv` before the parser lists the systems; returns them
    as a worker process loads them again (files as absolute paths)."""
    from marconi.systems import load_plugin

    early = argparse.ArgumentParser(add_help=False)
    add_plugin_argument(early)
    plugins: list[str] = early.parse_known_args(list(argv))[0].plugin
    for plugin in plugins:
        load_plugin(plugin)
    return [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins]
