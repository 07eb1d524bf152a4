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
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from marconi.core.cache import PrefixCache
from marconi.core.layout import Layout
from marconi.core.policy import Admission, Eviction, check_alpha
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, StateStore
from marconi.core.tuning import SAMPLE_AFTER, Objective, Tuner
from marconi.core.units import parse_size

Policies = tuple[Admission, Eviction]
PolicyFactory = Callable[[ModelSpec, float], Policies]  # (spec, alpha) -> fresh policies
LayoutFactory = Callable[[ModelSpec, int], Layout]  # (spec, capacity in bytes) -> layout


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerOptions:
    """How a driver wants its tuner (the same knobs for every kind of tuner)."""

    multiplier: int = 5  # bootstrap window = multiplier x requests before the first eviction
    objective: Objective = Objective.FLOPS  # what the tuner maximizes
    executor: Executor | None = None  # where replays run; None: the tuner's own choice
    wait: bool = False  # adopt a replay's result on a later commit (never blocking one), or
    # block on it (deterministic runs: the simulator asks for this)
    # start on the expert that checkpoints the first message's end, where the tuner has
    # one (a chat server, whose requests start with system prompts)
    first_boundary: bool = False
    # requests after which a tuner may sample a long stream (marconi+'s shadows, by
    # session, where the driver names sessions); None: never
    sample_after: int | None = SAMPLE_AFTER


TunerFactory = Callable[[TunerOptions], Tuner]


@dataclass(frozen=True, slots=True, kw_only=True)
class System:
    """A named caching system."""

    name: str  # what users type: --system NAME
    policies: PolicyFactory  # fresh admission and eviction for one cache
    tuner: TunerFactory | None = None  # what tunes it online; None: nothing to tune
    uses_alpha: bool = False  # whether alpha means anything to its eviction
    description: str = ""  # one line for --help and docs
    engine_layout: LayoutFactory | None = None  # its engine's memory layout; None: bytes

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
              evict_with: Callable[[Eviction], Eviction] | None = None) -> PrefixCache:
        """A fresh, empty cache running this system (`alpha`: fixed, else 0 until tuned;
        `page_size`, `state_slots`: as in `layout`, 0 slots meaning one byte budget;
        `evict_with(eviction)`: the eviction to run instead of the system's, given it)."""
        admission, eviction = self.policies(spec, check_alpha(alpha or 0.0))
        if evict_with is not None:
            eviction = evict_with(eviction)
        layout = self.layout(spec, capacity, page_size=page_size, state_slots=state_slots)
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
    """The registered system called `name`, or ValueError listing the known ones."""
    if isinstance(name, System):
        return name
    try:
        return SYSTEMS[name]
    except (KeyError, TypeError):
        known = ", ".join(SYSTEMS)
        raise ValueError(f"unknown system {name!r}; known systems: {known}") from None


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
    from marconi.paper.tuner import BootstrapTuner

    return BootstrapTuner(multiplier=options.multiplier, objective=options.objective,
                          executor=options.executor, wait=options.wait)


def shadows(modes: tuple[str, ...] = ("density", "depth", "flop"),
            boundaries: bool = True) -> TunerFactory:
    """marconi+'s shadow experts over these eviction modes (and every boundary choice, or
    none when `boundaries` is False)."""

    def make(options: TunerOptions) -> Tuner:
        from marconi.plus.shadows import EXPERTS, Boundaries, Expert, ShadowConfig, ShadowTuner

        experts = tuple(e for e in EXPERTS if e.mode.value in modes
                        and (boundaries or e.boundaries is Boundaries.NONE))
        first = Expert(Boundaries.FIRST, experts[0].mode)
        if options.first_boundary and first in experts:
            experts = (first, *(e for e in experts if e != first))
        return ShadowTuner(ShadowConfig(experts=experts, objective=options.objective,
                                        sample_after=options.sample_after))

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


def _sglang_memory(spec: ModelSpec, capacity: int) -> Layout:
    """SGLang's layout: KV per token beside a state pool of 0.9 / 1.9 of the memory."""
    from marconi.peers.mamba_radix import sglang_layout

    return sglang_layout(spec, capacity)


def _vllm_memory(spec: ModelSpec, capacity: int) -> Layout:
    """vLLM's layout for hybrid models: KV in pages of its attention block size."""
    from marconi.peers.mamba_align import vllm_layout

    return vllm_layout(spec, capacity)


@system("sglang-2026", "SGLang MambaRadixCache (no-buffer): states at chunk, prefill and "
        "request ends; KV and state LRU lists; its layout: a state pool beside the KV",
        engine_layout=_sglang_memory)
def _sglang_2026(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.peers.mamba_radix import MambaRadix, MambaRadixLRU

    return MambaRadix(), MambaRadixLRU()


@system("sglang-2026-extra", "SGLang MambaRadixCache (extra-buffer): 64-aligned chunk and "
        "branch states; its layout: a state pool beside the KV", engine_layout=_sglang_memory)
def _sglang_2026_extra(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.peers.mamba_radix import BufferMode, MambaRadix, MambaRadixLRU, SGLangConfig

    extra = SGLangConfig(mode=BufferMode.EXTRA_BUFFER)
    return MambaRadix(extra), MambaRadixLRU(extra)


@system("vllm-2026", "vLLM v1 align mode: block-aligned states, shared-prefix junctions, "
        "block LRU; its layout: KV in pages of its block size", engine_layout=_vllm_memory)
def _vllm_2026(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.peers.mamba_align import Align, BlockLRU

    return Align(), BlockLRU()


# --- marconi+ and its ablation ----------------------------------------------------------------


def _plus(name: str, description: str, tuner: TunerFactory | None, mode: str = "density",
          depth: bool = True) -> None:
    """marconi+'s policies: judicious admission (experts add boundaries), Switchable
    eviction starting in `mode`, its FLOP mode GreedyDual-FLOP, with the depth-classed
    expert only if something may switch to it (`depth`)."""

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.plus.admission import PLAIN, Structured
        from marconi.plus.switchable import Mode, Switchable

        return Structured(PLAIN), Switchable(spec, Mode(mode), depth=depth)

    register(System(name=name, policies=policies, tuner=tuner, description=description))


_plus("marconi+", "hit-density eviction (leaves in one class or by depth), GreedyDual-FLOP "
      "and message-boundary admission, chosen online by shadow experts", shadows())
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

MARCONI_PLUS = SYSTEMS["marconi+"]
