"""Named systems: each a bundle of an admission and an eviction policy, and a tuner.

```python
cache = make_cache(PAPER_7B, "2GB", "marconi")     # a PrefixCache running the system
tuner = get_system("marconi").make_tuner()         # the driver calls tuner.observe(...)
```
Every registration below is one line of metadata and a factory that imports its policy
family when called, so listing the systems (CLI choices, tests parametrized over the
registry) loads no policy module, and no policy module imports this one. Adding a
policy: one module in its family, one `@system(...)` factory here (docs/architecture.md).
"""

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
    # the engine whose real cache code replays it (marconi.realpeers); None: in process
    engine: str | None = None
    # why its memory grows with the stream beyond the cache's capacity (a server refuses
    # it: it is for replays); "": it keeps no more than its cache
    unbounded: str = ""

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
              as_engine: bool = False, replay: bool = False) -> PrefixCache:
        """A fresh, empty cache running this system (`alpha`: fixed, else 0 until tuned;
        `page_size`, `state_slots`: as in `layout`, 0 slots meaning one byte budget;
        `evict_with(eviction)`: the eviction to run instead of the system's, given it;
        `as_engine`: count memory as its engine's pool does, `engine_memory`; `replay`: a
        token-only replay's cache, on the compiled core where it runs the system,
        `marconi.core.compiled`)."""
        admission, eviction = self.policies(spec, check_alpha(alpha or 0.0))
        if evict_with is not None:
            eviction = evict_with(eviction)
        layout = self.layout(spec, capacity, page_size=page_size, state_slots=state_slots)
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


# --- tuners -------------------------------------------------------------------------------


def bootstrap(options: TunerOptions) -> Tuner:
    """Marconi's bootstrap alpha tuner."""
    from marconi.paper.tuner import bootstrap_tuner

    return bootstrap_tuner(options.settings, executor=options.executor, wait=options.wait)


def shadows(modes: tuple[str, ...] = ("density", "depth", "flop"),
            boundaries: bool = True, overlap: bool = True, whole_memory: bool = False
            ) -> TunerFactory:
    """marconi+'s shadow experts over these eviction modes (and every message boundary
    choice, or none when `boundaries` is False; and the overlap planner's positions when
    `overlap`, its planner keeping every sequence seen when `whole_memory`, else the
    latest `OVERLAP_MEMORY` tokens)."""

    def make(options: TunerOptions) -> Tuner:
        from marconi.plus.shadows import OVERLAP_MEMORY, shadow_tuner

        return shadow_tuner(modes, boundaries, options.settings,
                            first_boundary=options.first_boundary, overlap=overlap,
                            overlap_memory=None if whole_memory else OVERLAP_MEMORY)

    return make


# --- the paper's systems --------------------------------------------------------------------


@system("vanilla", "no prefix caching")
def _vanilla(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import NoAdmission
    from marconi.paper.eviction import LRULeaf

    return NoAdmission(), LRULeaf()


@system("vllm+", "paper baseline: a checkpoint every 32-token block, LRU over blocks")
def _vllm_plus(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Block
    from marconi.paper.eviction import LRULeaf

    return Block(32), LRULeaf(deepest_first=True)


@system("sglang+", "paper baseline: judicious admission, LRU over leaves")
def _sglang_plus(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import LRULeaf

    return Judicious(), LRULeaf()


@system("marconi", "the paper: judicious admission, FLOP-aware eviction, bootstrap alpha",
        tuner=bootstrap, uses_alpha=True)
def _marconi(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import FlopAware

    return Judicious(), FlopAware(spec, alpha)


@system("marconi-inverse-age", "marconi with the artifact's recency 1/(now - t + 1)",
        tuner=bootstrap, uses_alpha=True)
def _marconi_inverse_age(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import FlopAware, Recency

    return Judicious(), FlopAware(spec, alpha, Recency.INVERSE_AGE)


# --- today's engines (what each models: docs/peers.md) ---------------------------------------
# The emulations (`sglang-2026`, `vllm-2026`) are in-process caches; `sglang-0.5.23` and
# `vllm-0.32` run the engines' real cache code in their own environments
# (scripts/setup-peers.sh), replayed by `marconi.realpeers`; each has the options of the
# engine flags it runs (`--system sglang-0.5.23:strategy=extra_buffer,eviction=lfu`).

SGLANG_STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
SGLANG_EVICTIONS = ("lru", "lfu", "slru", "priority", "tlru")  # 0.5.23's --radix-eviction-policy


def _sglang_options(strategies: tuple[str, ...], evictions: tuple[str, ...],
                    pages: tuple[str, ...], real: bool) -> tuple[Option, ...]:
    real_code = "" if real else \
        "the emulation does not model it; sglang-0.5.23 runs SGLang's own code with it"
    out = (
        Option(name="strategy", default="no_buffer", choices=strategies,
               help="--mamba-radix-cache-strategy: where states are tracked",
               elsewhere=real_code),
        Option(name="eviction", default="lru", choices=evictions,
               help="--radix-eviction-policy: the KV tree's eviction order",
               elsewhere=real_code),
        Option(name="page_size", default=1, kind=int, minimum=1, help="--page-size (tokens)")
        if real else Option(name="page_size", default="1", choices=pages,
                            help="--page-size (tokens; the emulation models 1)",
                            elsewhere=real_code),
        Option(name="mamba_full_memory_ratio", default=0.9, kind=float, minimum=0.01,
               help="--mamba-full-memory-ratio: state pool bytes / KV pool bytes"),
        Option(name="chunked_prefill_size", default=8192, kind=int, minimum=1,
               help="--chunked-prefill-size: the longest prefill chunk (tokens)"),
    )
    core = Option(name="core", default="python", choices=("python", "rust"),
                  help="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: the tree's implementation")
    return (*out, core, *_integration_options("SGLang", "sglang", " (needs core=python)")) \
        if real else out


def _integration_options(engine: str, module: str, needs: str = "") -> tuple[Option, ...]:
    """The options of a real-engine system that installs marconi's integration."""
    return (
        Option(name="integration", default="none", choices=("none", "marconi", "marconi+"),
               help=f"installed in {engine}'s own cache (marconi.integrations.{module}): "
                    f"Marconi's eviction and bootstrap tuner (marconi), or marconi+'s "
                    f"shadow experts choosing among the orders it can run (marconi+)"
                    f"{needs}"),
        Option(name="tuner", default="thread", choices=("thread", "inline"),
               help="the integration's tuner: in its own thread (as deployed) or inline "
                    "(reproducible)"))


def _sglang_config(settings: Settings) -> object:
    from marconi.peers.mamba_radix import BufferMode, SGLangConfig

    ratio = float(settings["mamba_full_memory_ratio"])  # type: ignore[arg-type]
    return SGLangConfig(mode=BufferMode(str(settings["strategy"]).replace("_", "-")),
                        chunk=int(settings["chunked_prefill_size"]),  # type: ignore[call-overload]
                        state_share=ratio / (1.0 + ratio))


def _sglang(name: str, description: str, settings: Settings, real: bool) -> System:
    """SGLang's hybrid cache with `settings` (the emulation, or the real code's entry)."""

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_radix import MambaRadix, MambaRadixLRU

        if real:
            raise ValueError(f"{name} runs SGLang's own cache code in its environment, "
                             "not in this process (sglang-2026 is its in-process emulation)")
        config = _sglang_config(settings)
        return MambaRadix(config), MambaRadixLRU(config)  # type: ignore[arg-type]

    def layout(spec: ModelSpec, capacity: int) -> Layout:
        from marconi.peers.mamba_radix import sglang_layout

        return sglang_layout(spec, capacity, _sglang_config(settings))  # type: ignore[arg-type]

    def memory(spec: ModelSpec, capacity: int) -> tuple[ModelSpec, int]:
        from marconi.peers.mamba_radix import sglang_memory

        return sglang_memory(spec, capacity)

    return System(name=name, policies=policies, description=description, engine_layout=layout,
                  engine_memory=memory, engine="sglang" if real else None)


def _sglang_marconi(name: str, description: str, settings: Settings, real: bool) -> System:
    """SGLang's admission and layout with Marconi's eviction and tuner: what
    marconi.integrations.sglang puts into SGLang, emulated (its tuner's mirror)."""
    base = _sglang(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_radix import MambaRadix, MambaRadixFlop

        config = _sglang_config(settings)
        return MambaRadix(config), MambaRadixFlop(config, spec, alpha)  # type: ignore[arg-type]

    return replace(base, policies=policies, tuner=bootstrap, uses_alpha=True)


def _vllm_options(real: bool = False) -> tuple[Option, ...]:
    return *(
        Option(name="mamba_cache_mode", default="align", choices=("align",),
               help="--mamba-cache-mode: where states are cached (0.32 has align only)"),
        Option(name="block_size", default=None, kind=int, minimum=1, optional=True,
               help="--block-size (tokens); none: derived from the model as vLLM does"),
        Option(name="max_num_batched_tokens", default=8192, kind=int, minimum=1,
               help="--max-num-batched-tokens: the longest prefill step"),
        Option(name="retention_interval", default=0, kind=int, minimum=0, optional=True,
               help="--prefix-cache-retention-interval (tokens): 0 keeps only reusable "
                    "boundaries, R one state per R tokens, none every block's"),
    ), *((*_integration_options("vLLM", "vllm"),
          Option(name="orphans", default="first", choices=("first", "keep"),
                 help="with integration=marconi: cached KV past a request's last state "
                      "evicted before anything else (first) or left in vLLM's order "
                      "(keep, an ablation)"))
         if real else ())


def _vllm_config(settings: Settings) -> object:
    from marconi.peers.mamba_align import VLLMConfig

    block, retention = settings["block_size"], settings["retention_interval"]
    return VLLMConfig(block=None if block is None else int(block),  # type: ignore[call-overload]
                      chunk=int(settings["max_num_batched_tokens"]),  # type: ignore[call-overload]
                      retention=None if retention is None else int(retention))  # type: ignore[call-overload]


def _vllm(name: str, description: str, settings: Settings, real: bool) -> System:
    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_align import Align, BlockLRU

        if real:
            raise ValueError(f"{name} runs vLLM's own cache code in its environment, "
                             "not in this process (vllm-2026 is its in-process emulation)")
        return Align(_vllm_config(settings)), BlockLRU()  # type: ignore[arg-type]

    def layout(spec: ModelSpec, capacity: int) -> Layout:
        from marconi.peers.mamba_align import vllm_layout

        return vllm_layout(spec, capacity, _vllm_config(settings))  # type: ignore[arg-type]

    def memory(spec: ModelSpec, capacity: int) -> tuple[ModelSpec, int]:
        from marconi.peers.mamba_align import vllm_memory

        return vllm_memory(spec, capacity, _vllm_config(settings))  # type: ignore[arg-type]

    return System(name=name, policies=policies, description=description, engine_layout=layout,
                  engine_memory=memory, engine="vllm" if real else None)


def _vllm_marconi(name: str, description: str, settings: Settings, real: bool) -> System:
    """vLLM's admission and layout with Marconi's order for states: what
    marconi.integrations.vllm puts into vLLM, emulated (its tuner's mirror)."""
    base = _vllm(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_align import Align, BlockFlop

        return Align(_vllm_config(settings)), BlockFlop(spec, alpha)  # type: ignore[arg-type]

    return replace(base, policies=policies, tuner=bootstrap, uses_alpha=True)


def register_configurable(name: str, options: tuple[Option, ...],
                          configure: Callable[[Settings], System]) -> System:
    """Register `configure(defaults)` as `name`, configurable by its `options`."""
    return register(configured_base(name, options, configure))


def configured_base(name: str, options: tuple[Option, ...],
                    configure: Callable[[Settings], System]) -> System:
    defaults = {o.name: o.default for o in options}
    return replace(configure(defaults), name=name, options=options, configure=configure,
                   settings=defaults)


def _peer(name: str, description: str, make: Callable[[str, str, Settings, bool], System],
          options: tuple[Option, ...], real: bool, **fixed: object) -> None:
    def configure(settings: Settings) -> System:
        return make(name, description, {**settings, **fixed}, real)

    register_configurable(name, options, configure)


_peer("sglang-2026", "SGLang emulation (no-buffer): states at chunk, prefill and request "
      "ends; KV and state LRU lists; its layout: a state pool beside the KV", _sglang,
      _sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",), real=False), False)
_peer("sglang-2026-extra", "SGLang emulation (extra-buffer): 64-aligned chunk and branch "
      "states; its layout: a state pool beside the KV", _sglang,
      tuple(o for o in _sglang_options((), ("lru",), ("1",), real=False)
            if o.name != "strategy"), False, strategy="extra_buffer")
_peer("sglang-2026+marconi", "SGLang emulation with Marconi's FLOP-aware eviction and "
      "bootstrap tuner (what marconi.integrations.sglang installs); its layout: a state "
      "pool beside the KV", _sglang_marconi,
      _sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",), real=False), False)
_peer("vllm-2026", "vLLM emulation (align mode): block-aligned states, shared-prefix "
      "junctions, block LRU; its layout: KV in pages of its block size", _vllm,
      _vllm_options(), False)
_peer("vllm-2026+marconi", "vLLM emulation with Marconi's order for the states its block "
      "queue evicts and the bootstrap tuner (what marconi.integrations.vllm installs); its "
      "layout: KV in pages of its block size", _vllm_marconi, _vllm_options(), False)
_peer("sglang-0.5.23", "SGLang 0.5.23's own UnifiedRadixCache, replayed in its environment "
      "(scripts/setup-peers.sh)", _sglang,
      _sglang_options(SGLANG_STRATEGIES, SGLANG_EVICTIONS, ("1",), real=True), True)
_peer("vllm-0.32", "vLLM 0.32's own KVCacheManager, replayed in its environment "
      "(scripts/setup-peers.sh)", _vllm, _vllm_options(real=True), True)


# --- marconi+ and its ablation ----------------------------------------------------------------


UNBOUNDED_PLANNER = ("its checkpoint placement keeps every sequence it has seen, so its "
                     "memory grows with the stream")


def _plus(name: str, description: str, tuner: TunerFactory | None, mode: str = "density",
          depth: bool = True, unbounded: str = "") -> None:
    """marconi+'s policies: judicious admission (experts add boundaries), Switchable
    eviction starting in `mode`, its FLOP mode GreedyDual-FLOP, with the depth-classed
    expert only if something may switch to it (`depth`)."""

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.plus.admission import PLAIN, Structured
        from marconi.plus.switchable import Mode, Switchable

        return Structured(PLAIN), Switchable(spec, Mode(mode), depth=depth)

    register(System(name=name, policies=policies, tuner=tuner, description=description,
                    unbounded=unbounded))


_plus("marconi+", "hit-density eviction (leaves in one class or by depth) or GreedyDual-FLOP, "
      "with message-boundary or sparse-prefix admission, or sglang+'s configuration, "
      "chosen online by shadow experts", shadows())
_plus("marconi+-density", "hit-density eviction alone, judicious admission", None,
      depth=False)
_plus("marconi+-depth", "hit-density eviction with leaves classed by depth alone, "
      "judicious admission", None, "depth")
_plus("marconi+-gd", "GreedyDual-FLOP eviction alone, judicious admission", None, "flop",
      depth=False)
_plus("marconi+-no-depth", "marconi+ without the depth-classed experts (the previous design)",
      shadows(modes=("density", "flop")), depth=False)
_plus("marconi+-no-gd", "marconi+ without the GreedyDual-FLOP experts",
      shadows(modes=("density", "depth")))
_plus("marconi+-no-density", "marconi+ without hit density (the design before: "
      "GreedyDual-FLOP and LRU experts)", shadows(modes=("flop", "lru")), "flop", depth=False)
_plus("marconi+-no-boundaries", "marconi+ without boundary checkpoints",
      shadows(boundaries=False))
_plus("marconi+-overlap", "marconi+ with its overlap planner keeping every sequence seen "
      "(sparse prefix caching's placement as the peer plans it; for replays)",
      shadows(whole_memory=True), unbounded=UNBOUNDED_PLANNER)
_plus("marconi+-no-overlap", "marconi+ without sparse prefix caching's placement (the design "
      "before 2026-12-04)", shadows(overlap=False))

MARCONI_PLUS = SYSTEMS["marconi+"]


# --- other baselines (what each models: docs/peers.md, "Other baselines") -----------------


def _seglen(settings: Settings) -> System:
    weight = float(settings["weight"])  # type: ignore[arg-type]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.admission import Judicious
        from marconi.peers.seglen import SegLen

        return Judicious(), SegLen(weight)

    return System(name="seglen", policies=policies,
                  description="judicious admission; eviction by recency + weight x replay "
                              "length to the nearest state above (SegLen, SGLang's proposal)")


register_configurable("seglen", (
    Option(name="weight", default=0.85, kind=float, minimum=0.0,
           help="--seglen-eff-weight: the replay length's weight beside recency"),), _seglen)


def _tlru(name: str, description: str, settings: Settings, real: bool) -> System:
    """`sglang-2026` with its KV list in T-LRU order (SGLang's `tlru` strategy)."""
    threshold = int(settings["threshold"])  # type: ignore[call-overload]
    estimate = int(settings["next_prompt_estimate"])  # type: ignore[call-overload]
    if threshold <= estimate:
        raise ValueError(f"system {name}: threshold ({threshold}) must exceed "
                         f"next_prompt_estimate ({estimate}), as SGLang requires; otherwise "
                         "no token is ever TEL-safe and T-LRU is LRU (sglang-2026)")
    base = _sglang(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_radix import MambaRadix
        from marconi.peers.tlru import TailLRU

        config = _sglang_config(settings)
        return MambaRadix(config), TailLRU(config, threshold=threshold,  # type: ignore[arg-type]
                                           next_prompt=estimate)

    return replace(base, policies=policies)


_peer("tlru", "SGLang emulation with tail-optimized LRU for its KV (--radix-eviction-policy "
      "tlru): a conversation's KV past what keeps its next prefill within threshold tokens "
      "leaves first, then LRU", _tlru,
      (*(o for o in _sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",),
                                    real=False) if o.name != "eviction"),
       Option(name="threshold", default=4096, kind=int, minimum=0,
              help="--radix-eviction-policy-config threshold: the tokens a next prefill "
                   "may compute within its TTFT budget"),
       Option(name="next_prompt_estimate", default=512, kind=int, minimum=0,
              help="--radix-eviction-policy-config next_prompt_estimate: the tokens a "
                   "next prompt is expected to add")), False)


def _llamacpp(settings: Settings) -> System:
    checkpoints = int(settings["ctx_checkpoints"])  # type: ignore[call-overload]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.llamacpp import ContextCheckpoints, SlotBook, SlotFIFO

        book = SlotBook()
        return ContextCheckpoints(book), SlotFIFO(book, checkpoints)

    return System(name="llamacpp-2026", policies=policies,
                  description="llama.cpp server slots (one per session) with context "
                              "checkpoints: the longest of the slot's own checkpoints and "
                              "live state, newest N checkpoints kept")


register_configurable("llamacpp-2026", (
    Option(name="ctx_checkpoints", default=32, kind=int, minimum=1,
           help="--ctx-checkpoints: checkpoints a slot keeps (oldest dropped first)"),),
    _llamacpp)


def _sparse_prefix(settings: Settings) -> System:
    budget = int(settings["budget"])  # type: ignore[call-overload]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.eviction import LRULeaf
        from marconi.peers.sparse_prefix import SparsePrefix

        return SparsePrefix(budget), LRULeaf()

    return System(name="sparse-prefix", policies=policies,
                  description="sparse prefix caching: per input at most `budget` states, "
                              "placed by a dynamic program over the overlap depths seen so "
                              "far; LRU over leaves", unbounded=UNBOUNDED_PLANNER)


register_configurable("sparse-prefix", (
    Option(name="budget", default=4, kind=int, minimum=1,
           help="checkpoints a sequence may hold (the placement's budget)"),), _sparse_prefix)
