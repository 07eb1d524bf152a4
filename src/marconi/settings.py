"""Run settings, each declared once: a dataclass field with its type, default and help.

```python
@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    sps: float = setting(1.0, "sessions per second (session i starts at i / sps)")
```
`declared(TraceOptions)` reads the declarations back as `Setting`s; every front end takes
its names from them: the CLI flags (`--sps`, `add_arguments`), a sweep's `--param` axes
and TOML keys (`marconi.sim.cell`), and the keywords of `marconi.api`. The classes that
declare settings are `RunChoice` here (the model, capacity, system and alpha a run names),
`workload.TraceOptions` (what shapes a trace) and `sim.SimConfig` (how it is replayed);
docs/architecture.md ("Settings") lists them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def nearest(value: str, choices: Iterable[str]) -> str:
    """" (did you mean X?)" naming the choice closest to a mistyped `value`, else ""."""
    found = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]}?)" if found else ""

SETTING = "marconi.setting"  # the key of a declared field's metadata
NONE_WORDS = ("none",)  # what a flag or a sweep value says for None


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One declared setting: its name (the flag without dashes, the sweep and TOML key, the
    API keyword), its type and default, and one line of help."""

    name: str
    kind: type  # bool, int, float or str
    optional: bool  # None is a value ("none" where it is typed as text)
    default: object
    help: str
    choices: tuple[str, ...] = ()  # the values allowed (str kind); empty: any
    minimum: float | None = None  # the smallest value allowed (int and float kinds)
    positive: bool = False  # > 0 (float kinds: `minimum` is inclusive)
    none_words: tuple[str, ...] = NONE_WORDS  # the words that mean None, where optional
    metavar: str | None = None
    # the help of the `--no-NAME` flag of a bool setting on by default: what the flag does
    # (`help` says what the setting does when on, for a sweep's key and the API's keyword)
    off: str | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: `--NAME` with dashes; a setting on by default is turned
        off with `--no-NAME`."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind is bool and self.default is True else f"--{dashed}"

    def parse(self, text: str) -> object:
        """The value `text` names (a flag's or a sweep axis's), or ValueError naming this
        setting and what it accepts."""
        word = text.strip()
        if self.optional and word.lower() in self.none_words:
            return None
        if self.kind is bool:
            if word.lower() in ("1", "true", "yes", "on"):
                return True
            if word.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{self.name}: {text!r} is not true or false")
        try:
            return self.check(self.kind(word))
        except ValueError:
            raise ValueError(f"{self.name}: {text!r} is not {self.accepts()}") from None

    def check(self, value: object) -> object:
        """`value` (a TOML value, an API keyword's) when it is one this setting takes, else
        ValueError naming the setting, the value and what it accepts. The value is kept as
        given (an int for a float setting stays an int: a sweep cell's id hashes it)."""
        if value is None and self.optional:
            return None
        if not self._typed(value):
            raise ValueError(f"{self.name}: {value!r} is not {self.accepts()}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name}: {value!r} is not {self.accepts()}"
                             f"{nearest(str(value), self.choices)}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            low = self.minimum
            if not math.isfinite(value) or (self.positive and not value > 0) \
                    or (low is not None and value < low):
                raise ValueError(f"{self.name}: {value!r} is not {self.accepts()}")
        return value

    def _typed(self, value: object) -> bool:
        if self.kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self.kind is float:
            return isinstance(value, int | float)
        return isinstance(value, self.kind)

    def accepts(self) -> str:
        """What this setting accepts, in words."""
        if self.choices:
            text = " or ".join(self.choices)
        elif self.kind is bool:
            text = "true or false"
        else:
            text = {int: "a whole number", float: "a number", str: "text"}[self.kind]
            if self.positive:
                text += " > 0"
            elif self.minimum is not None:
                text += f" >= {self.minimum:g}"
        return text + (f" or {self.none_words[0]}" if self.optional else "")


def setting(default: Any, help: str, *, choices: tuple[str, ...] = (),
            minimum: float | None = None, positive: bool = False,
            none_words: tuple[str, ...] = NONE_WORDS, metavar: str | None = None,
            off: str | None = None) -> Any:
    """A dataclass field declaring a setting (`declared` reads it back). `off`: the help
    of the `--no-NAME` flag, for a bool setting on by default (required there)."""
    if (default is True) != (off is not None):
        raise TypeError("`off` (the --no-NAME flag's help) goes with a bool setting on by "
                        "default, and only there")
    meta = {"help": help, "choices": choices, "minimum": minimum, "positive": positive,
            "none_words": none_words, "metavar": metavar, "off": off}
    return field(default=default, metadata={SETTING: meta})


def declared(cls: type) -> tuple[Setting, ...]:
    """The settings `cls` declares, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(SETTING)
        if meta is None:
            continue
        kind, optional = _kind(hints[f.name])
        out.append(Setting(name=f.name, kind=kind, optional=optional, default=f.default, **meta))
    return tuple(out)


def _kind(hint: object) -> tuple[type, bool]:
    """(bool | int | float | str, whether None is allowed) of a field's type."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) \
        or typing.get_origin(hint) is typing.Union else (hint,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
        raise TypeError(f"a setting must be bool, int, float or str (or optional), not {hint}")
    return kinds[0], len(kinds) < len(args)


def check_all(instance: object, settings: Iterable[Setting]) -> None:
    """ValueError naming the first declared setting of `instance` whose value it does not
    take (what `__post_init__` of a declaring class runs)."""
    for s in settings:
        s.check(getattr(instance, s.name))


def by_name(settings: Iterable[Setting]) -> dict[str, Setting]:
    return {s.name: s for s in settings}


def add_arguments(group: Any, settings: Iterable[Setting], *,
                  defaults: Mapping[str, object] | None = None) -> None:
    """One flag per setting in `group` (an argparse parser or argument group), its value
    under the setting's name. `defaults`: a different default for some of them."""
    for s in settings:
        default = (defaults or {}).get(s.name, s.default)
        if s.kind is bool:
            on = s.default is True
            group.add_argument(s.flag, dest=s.name, default=default,
                               help=s.off if on else s.help,
                               action="store_false" if on else "store_true")
            continue
        group.add_argument(s.flag, dest=s.name, default=default, type=argument_type(s),
                           help=s.help, metavar=s.metavar,
                           **({"choices": s.choices} if s.choices else {}))


def argument_type(s: Setting) -> Any:
    """An argparse `type` parsing `s`'s text (its error naming what `s` accepts)."""

    def parse(text: str) -> object:
        try:
            return s.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[-1]) from None

    parse.__name__ = s.kind.__name__  # what argparse names in "invalid ... value"
    return parse


def values_of(args: argparse.Namespace, settings: Iterable[Setting]) -> dict[str, Any]:
    """The values `add_arguments`' flags hold in `args`, by setting name."""
    return {s.name: getattr(args, s.name) for s in settings}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunChoice:
    """What every run names, declared once: the CLI's flags (`--model`, `--capacity`,
    `--system`, `--alpha`), the library's keywords (`marconi.api`), a sweep's parameters
    and the server's defaults read these (their values are checked where they are used:
    a model by `core.spec.model_from`, a size by `parse_size`, a system by the registry)."""

    model: str = setting("paper-7b", "preset with optional overrides (paper-7b,ssm=28,attn=7,"
                         "N=64) or a local Hugging Face config.json")
    capacity: str = setting("2GB", "bytes for KV + SSM states: 2GB, 2GiB, 1e9")
    system: str = setting("marconi", "the caching system, with its options where it has "
                          "them (SYSTEM:K=V,...)")
    # 0 to 2: the bootstrap tuner's grid (paper.tuner.GRID); beyond it the CLI warns
    alpha: float | None = setting(None, "fix alpha (FLOP-aware systems), >= 0; the tuner "
                                  "picks from 0 to 2 (beyond 2: a warning); none: the "
                                  "system's own (bootstrap-tuned)", minimum=0.0)


RUN: dict[str, Setting] = by_name(declared(RunChoice))  # model, capacity, system, alpha
DEFAULT = RunChoice()  # their defaults, typed (`DEFAULT.system`)
