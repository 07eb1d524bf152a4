"""What every `marconi` command shares: help that shows defaults, errors in one line (with
the nearest valid choice), and `--plugin`."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from marconi.settings import nearest

SIZE_UNIT = re.compile(r"(?i)[kmgt]i?b|b|bytes")
NUMBER = re.compile(r"-?[\d.]+(e-?\d+)?")


def _with_nearest(message: str) -> str:
    """argparse's "invalid choice" message with the nearest choice named."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if found is None:
        return message
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    return f"{message[:found.start()]}invalid choice '{found.group(1)}'" \
        f"{nearest(found.group(1), choices)}; choose from {', '.join(choices)}"


def _hidden(default: Any) -> bool:
    """Defaults not worth showing: none, a flag's False, suppressed, empty (0 and 0.0 are
    shown: they are values, and `0 == False`)."""
    return default is None or default is False or default is argparse.SUPPRESS \
        or default == "" or default == []


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to every option that takes a value and has a default worth
    showing (a flag's own name says what it does: `--no-bounds` is not "default: True")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default: Any = action.default
        if "%(default)" in text or not action.option_strings or action.nargs == 0 \
                or _hidden(default):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults and whose errors are one line, naming
    the flag, the value and the nearest valid choice, without the usage; subcommands
    inherit the class. A negative number given to an option (`--capacity -5GB`) is taken
    as its value, so that the value's own check answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_with_nearest(message)}\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._joined(words), namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        words = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(words, namespace)
        if extras:
            self.error(self._unrecognized(words, extras, parsed))
        return parsed

    def _joined(self, words: list[str]) -> list[str]:
        """`--opt -5` as `--opt=-5` where `--opt` takes one value (argparse would take
        `-5GB` for an option and say only "expected one argument")."""
        out: list[str] = []
        i = 0
        while i < len(words):
            action = self._option_string_actions.get(words[i])
            if action is not None and action.nargs is None and i + 1 < len(words) \
                    and re.match(r"-[\d.]", words[i + 1]):
                out.append(f"{words[i]}={words[i + 1]}")
                i += 2
                continue
            out.append(words[i])
            i += 1
        return out

    def _unrecognized(self, words: list[str], extras: list[str],
                      parsed: argparse.Namespace) -> str:
        word = extras[0]
        at = words.index(word) if word in words else -1
        if at >= 2 and SIZE_UNIT.fullmatch(word) and NUMBER.fullmatch(words[at - 1]) \
                and words[at - 2].startswith("-"):
            return (f"argument {words[at - 2]}: '{words[at - 1]}' and '{word}' are two "
                    f"words; write the size without a space: {words[at - 2]} "
                    f"{words[at - 1]}{word}")
        parser: argparse.ArgumentParser = self
        for action in self._actions:  # the subcommand's parser knows its own options
            if isinstance(action, argparse._SubParsersAction):
                parser = action.choices.get(getattr(parsed, action.dest or "", ""), self)
        if word.startswith("-"):
            options = [o for a in parser._actions for o in a.option_strings]
            return f"unrecognized argument {word}{nearest(word.split('=')[0], options)}"
        return f"unrecognized argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"


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


def warn_alpha(alpha: float | None) -> None:
    """A loud line on stderr for an alpha beyond the bootstrap tuner's grid: a value no
    tuned run would pick (the FLOP term then outweighs recency wholesale), often a typo."""
    from marconi.core.tuning import ALPHA_GRID as GRID

    if alpha is not None and alpha > max(GRID):
        print(f"marconi: warning: --alpha {alpha:g} is beyond the tuner's grid ({min(GRID):g} "
              f"to {max(GRID):g}); the run goes on with it", file=sys.stderr)
