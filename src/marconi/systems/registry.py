"""The registry of named systems: what a system is (`System`), its options, and how
names reach it (`register`, `@system`, `get_system`, `make_cache`, `load_plugin`). Each
family's registrations live beside it in this package (`paper.py`, `engines.py`,
`plus.py`, `baselines.py`)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from marconi.core.cache import PrefixCache
from marconi.core.compiled import replay_cache
from marconi.core.layout import Layout
from marconi.core.policy import Admission, Eviction, check_alpha
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, StateStore
from marconi.core.tuning import Tuner
from marconi.core.units import parse_size
from marconi.settings import nearest

Policies = tuple[Admission, Eviction]
PolicyFactory = Callable[[ModelSpec, float], Policies]  # (spec, alpha) -> fresh policies
LayoutFactory = Callable[[ModelSpec, int], Layout]  # (spec, capacity in bytes) -> layout


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerOptions:
    """What a driver asks of a tuner: where and how it runs, and the run's settings, from
    which each kind of tuner takes those it has (its family reads them by name)."""

    executor: Executor | None = None  # where replays run; None: the tuner's own choice
    wait: bool = False  # adopt a replay's result on a later commit (never blocking one), or
    # block on it (deterministic runs: the simulator asks for this)
    # start on the expert that checkpoints the first message's end, where the tuner has
    # one (a chat server, whose requests start with system prompts)
    first_boundary: bool = False
    # the run settings by name (`SimConfig.settings()`); a name absent: the tuner's default
    settings: Mapping[str, object] = field(default_factory=dict)
    # the live cache's server (`marconi.core.serving.Serving`) where the driver serves
    # overlapping requests: a tuner that replays windows replays them the same way; None:
    # one request after another
    serving: object | None = None


TunerFactory = Callable[[TunerOptions], Tuner]
Settings = Mapping[str, object]  # a system's option values, by option name


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One setting of a system, set on the command line as `--system NAME:KEY=VALUE,...`
    (the engine's own flag, without dashes)."""

    name: str  # the key users type
    default: object  # what the system runs when the key is not given
    help: str  # one line: what it is, and the engine flag it stands for
    choices: tuple[str, ...] = ()  # allowed values; empty: any value of `kind`
    kind: type = str  # int, float or str (choices are strings)
    minimum: float | None = None  # the smallest value allowed (int and float kinds)
    optional: bool = False  # also accepts "none" (the engine's "off")
    elsewhere: str = ""  # where the values not allowed here run (said when one is refused)

    def parse(self, system: str, text: str) -> object:
        """The value of `text`, or ValueError naming the system, the option and what
        it accepts."""
        if self.optional and text.lower() == "none":
            return None
        allowed = ", ".join(self.choices) if self.choices else (
            f"{self.kind.__name__} >= {self.minimum:g}" if self.minimum is not None
            else self.kind.__name__) + (" or none" if self.optional else "")
        try:
            value = text if self.choices else self.kind(text)
        except ValueError:
            value = None
        if (value is None or (self.choices and value not in self.choices)
                or (self.minimum is not None and value < self.minimum)):  # type: ignore[operator]
            where = f"; {self.elsewhere}" if self.elsewhere else ""
            raise ValueError(f"system {system}: option {self.name}={text!r} is not allowed "
                             f"(allowed: {allowed}){where}")
        return value


def parse_settings(name: str, options: tuple[Option, ...], text: str) -> dict[str, object]:
    """`KEY=VALUE,...` (the part after `NAME:`) as typed values, every key known."""
    by_name = {o.name: o for o in options}
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in by_name:
            known = ", ".join(by_name) or "none"
            raise ValueError(f"system {name}: unknown option {key!r}{nearest(key, by_name)} "
                             f"(its options: {known})")
        if not eq:
            raise ValueError(f"system {name}: option {key!r} needs a value ({key}=VALUE)")
        values[key] = by_name[key].parse(name, value.strip())
    return values


def settings_name(base: str, options: tuple[Option, ...], values: Settings) -> str:
    """The canonical name of a configured system: options in declaration order, those
    at their default left out (`sglang-2026:strategy=extra_buffer`)."""
    given = [f"{o.name}={_text(values[o.name])}" for o in options
             if o.name in values and values[o.name] != o.default]
    return f"{base}:{','.join(given)}" if given else base


def _text(value: object) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class System:
    """A named caching system."""

    name: str  # what users type: --system NAME
    policies: PolicyFactory  # fresh admission and eviction for one cache
    tuner: TunerFactory | None = None  # what tunes it online; None: nothing to tune
    uses_alpha: bool = False  # whether alpha means anything to its eviction
    description: str = ""  # one line for --help and docs
    engine_layout: LayoutFactory | None = None  # its engine's memory layout; None: bytes
    # what its engine's memory amounts to: (spec, capacity) -> the spec and capacity its
    # cache counts (vLLM pads states to whole pages, keeps a null block); None: as given.
    # Only where asked (`cache(as_engine=True)`, the simulator): a cache over real tensors
    # counts those
    engine_memory: Callable[[ModelSpec, int], tuple[ModelSpec, int]] | None = None
    options: tuple[Option, ...] = ()  # settings users may give as NAME:KEY=VALUE,...
    # the same system with settings (defaults filled in) in force; None: no options
    configure: Callable[[Settings], System] | None = None
    settings: Settings = field(default_factory=dict)  # the values in force
    # the engine whose real cache code replays it (marconi.engines.real); None: in process
    engine: str | None = None
    # why its memory grows with the stream beyond the cache's capacity (a server refuses
    # it: it is for replays); "": it keeps no more than its cache
    unbounded: str = ""
    # when a running request's computed tokens become visible to others in its engine
    # (the serving replay, `marconi.core.serving.Visibility`): "finish" (marconi's engine),
    # "chunk" (SGLang: after each prefill chunk), "block" (vLLM: as blocks fill)
    visibility: str = "finish"
    # its engine's prefill step in tokens (SGLang's chunked prefill size, vLLM's
    # --max-num-batched-tokens); None: the serving replay's default
    chunk_tokens: int | None = None

    @property
    def tuned(self) -> bool:
        return self.tuner is not None

    def layout(self, spec: ModelSpec, capacity: int | str, *, page_size: int | None = None,
               state_slots: int | None = None) -> Layout:
        """The memory layout a cache of this system runs: each knob given, else the
        system's engine layout, else the single byte budget (docs/architecture.md)."""
        base = self.engine_layout(spec, parse_size(capacity)) if self.engine_layout else Layout()
        return Layout(page_size=base.page_size if page_size is None else page_size,
                      state_slots=base.state_slots if state_slots is None else state_slots)

    def cache(self, spec: ModelSpec, capacity: int | str, *, alpha: float | None = None,
              store: StateStore | None = None, on_evict: Callable[[Freed], None] | None = None,
              page_size: int | None = None, state_slots: int | None = None,
              evict_with: Callable[[Eviction], Eviction] | None = None,
              as_engine: bool = False, replay: bool = False,
              layout: Layout | None = None) -> PrefixCache:
        """A fresh, empty cache running this system (`alpha`: fixed, else 0 until tuned;
        `page_size`, `state_slots`: as in `layout`, 0 slots meaning one byte budget;
        `evict_with(eviction)`: the eviction to run instead of the system's, given it;
        `as_engine`: count memory as its engine's pool does, `engine_memory`; `replay`: a
        token-only replay's cache, on the compiled core where it runs the system,
        `marconi.core.compiled`); `layout`: the layout already resolved (a `SimConfig`'s),
        instead of `page_size` and `state_slots`)."""
        admission, eviction = self.policies(spec, check_alpha(alpha or 0.0))
        if evict_with is not None:
            eviction = evict_with(eviction)
        if layout is None:
            layout = self.layout(spec, capacity, page_size=page_size, state_slots=state_slots)
        elif page_size is not None or state_slots is not None:
            raise ValueError("give a cache's layout, or its page_size and state_slots, not both")
        if as_engine and self.engine_memory is not None:
            spec, capacity = self.engine_memory(spec, parse_size(capacity))
        if replay and store is None and on_evict is None:
            return replay_cache(spec, capacity, admission, eviction, name=self.name,
                                layout=layout)
        return PrefixCache(spec, capacity, admission, eviction, name=self.name, store=store,
                           on_evict=on_evict, page_size=layout.page_size,
                           state_slots=layout.state_slots)

    def make_tuner(self, alpha: float | None = None,
                   options: TunerOptions | None = None) -> Tuner | None:
        """The tuner a driver should call after each commit; None when there is nothing to
        tune (an untuned system, or alpha fixed by the user)."""
        if self.tuner is None or alpha is not None:
            return None
        return self.tuner(options or TunerOptions())


SYSTEMS: dict[str, System] = {}


def register(system: System) -> System:
    if system.name in SYSTEMS:
        raise ValueError(f"system {system.name!r} is already registered")
    SYSTEMS[system.name] = system
    return system


def system(name: str, description: str, *, tuner: TunerFactory | None = None,
           uses_alpha: bool = False, engine_layout: LayoutFactory | None = None
           ) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register the decorated policy factory as system `name`."""

    def add(policies: PolicyFactory) -> PolicyFactory:
        register(System(name=name, policies=policies, tuner=tuner, uses_alpha=uses_alpha,
                        description=description, engine_layout=engine_layout))
        return policies

    return add


def get_system(name: str | System) -> System:
    """The registered system called `name`, with its options when the name carries them
    (`sglang-2026:strategy=extra_buffer`), or ValueError naming what is wrong."""
    if isinstance(name, System):
        return name
    base, sep, text = name.partition(":") if isinstance(name, str) else (name, "", "")
    try:
        found = SYSTEMS[base]
    except (KeyError, TypeError):
        known = ", ".join(SYSTEMS)
        raise ValueError(f"unknown system {name!r}{nearest(str(base), SYSTEMS)}; known "
                         f"systems: {known} (or load your own with --plugin)") from None
    if not sep:
        return found
    if found.configure is None:
        raise ValueError(f"system {base} has no options (given {text!r})")
    return configured(found, parse_settings(base, found.options, text))


def configured(system: System, values: Settings) -> System:
    """`system` with `values` in force (the others at their defaults), named canonically;
    `system` itself when every value is its own."""
    assert system.configure is not None
    full = {o.name: values.get(o.name, o.default) for o in system.options}
    if full == dict(system.settings):
        return system
    key = (system.name, tuple((k, repr(v)) for k, v in full.items()))
    if key not in _CONFIGURED:
        made = system.configure(full)
        _CONFIGURED[key] = replace(made, name=settings_name(system.name, system.options, full),
                                   options=system.options, configure=system.configure,
                                   settings=full)
    return _CONFIGURED[key]


_CONFIGURED: dict[tuple[str, tuple[tuple[str, str], ...]], System] = {}


def split_systems(text: str) -> list[str]:
    """A comma-separated list of systems, where a system's own options are separated by
    commas too: `a,b:k=v,k2=v2,c` -> a, b:k=v,k2=v2, c (an item with `=` and no colon
    belongs to the system before it); `;` also separates systems."""
    out: list[str] = []
    for chunk in text.split(";"):
        for item in (part.strip() for part in chunk.split(",")):
            if not item:
                continue
            if "=" in item and ":" not in item and out and ":" in out[-1]:
                out[-1] += f",{item}"
            else:
                out.append(item)
    return out


def base_name(name: str) -> str:
    """A system name without its options (`sglang-2026` of `sglang-2026:strategy=...`)."""
    return name.partition(":")[0]


def load_plugin(source: str) -> ModuleType:
    """Import a module of user policies, whose `@system(...)` registrations then work by
    name everywhere (`--plugin`): a module name importable from the working directory, or
    a `.py` file. Loading the same plugin twice registers nothing twice."""
    if source.endswith(".py") or Path(source).expanduser().is_file():
        return _load_file(Path(source).expanduser())
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as err:
        raise ValueError(f"plugin {source!r}: no module named {err.name!r} (give a module "
                         "importable from here, or a .py file)") from None


def _load_file(path: Path) -> ModuleType:
    name = f"marconi_plugin_{path.resolve().stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ValueError(f"plugin {str(path)!r}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def make_cache(spec: ModelSpec, capacity: int | str, system: str | System = "marconi", *,
               alpha: float | None = None, store: StateStore | None = None,
               on_evict: Callable[[Freed], None] | None = None, page_size: int | None = None,
               state_slots: int | None = None) -> PrefixCache:
    """A fresh `PrefixCache` running the named system (see `System.cache`)."""
    return get_system(system).cache(spec, capacity, alpha=alpha, store=store,
                                    on_evict=on_evict, page_size=page_size,
                                    state_slots=state_slots)


def register_configurable(name: str, options: tuple[Option, ...],
                          configure: Callable[[Settings], System]) -> System:
    """Register `configure(defaults)` as `name`, configurable by its `options`."""
    return register(configured_base(name, options, configure))


def configured_base(name: str, options: tuple[Option, ...],
                    configure: Callable[[Settings], System]) -> System:
    defaults = {o.name: o.default for o in options}
    return replace(configure(defaults), name=name, options=options, configure=configure,
                   settings=defaults)


UNBOUNDED_PLANNER = ("its checkpoint placement keeps every sequence it has seen, so its "
                     "memory grows with the stream")
