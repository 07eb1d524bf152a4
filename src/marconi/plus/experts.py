"""marconi+'s experts: the ways to run the cache its shadows compare (which message
boundaries admission may checkpoint, which eviction runs), and how an expert is applied
to a cache and given a shadow of its own (`marconi.plus.shadows`, which chooses among
them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import cast

from marconi.core.cache import PrefixCache
from marconi.core.compiled import replay_cache
from marconi.core.layout import Layout
from marconi.plus.admission import Structured
from marconi.plus.switchable import Mode, Setting, Switchable


class Boundaries(Enum):
    """Which message boundaries of the input admission may checkpoint (besides Marconi's)."""

    NONE = "none"  # plain judicious admission
    FIRST = "first"  # the end of the first message (a system prompt: hits on its 2nd use)
    LAST = "last"  # the input's last boundary (reused when outputs are not: Mooncake-like)
    # sparse prefix caching's positions for the input (`marconi.plus.overlap`): no message
    # boundary needed (`shadow_tuner(overlap=True)`, marconi+'s default)
    OVERLAP = "overlap"


MESSAGE_BOUNDARIES = (Boundaries.NONE, Boundaries.FIRST, Boundaries.LAST)
OVERLAP_MEMORY = 1 << 24  # tokens of sequences marconi+'s overlap planner keeps
HEDGE = 32  # `marconi+-hedge`'s first requests admitted at every expert's positions


@dataclass(frozen=True, slots=True)
class Expert:
    boundaries: Boundaries
    mode: Mode  # DENSITY / DEPTH: hit density (DEPTH: leaf classes by depth); FLOP:
    # GreedyDual-FLOP; LRU: SGLang+'s LRU over leaves; MARCONI: Marconi's FLOP-aware score
    alpha: float = 0.0  # MARCONI only: the weight of FLOP efficiency against recency

    def __str__(self) -> str:
        name = EVICTION_NAMES[self.mode]
        if self.mode is Mode.MARCONI:
            name += f" {self.alpha:g}"
        return f"{self.boundaries.value}/{name}"


EVICTION_NAMES = {Mode.DENSITY: "density", Mode.DEPTH: "depth", Mode.FLOP: "gd",
                  Mode.LRU: "lru", Mode.MARCONI: "marconi"}
MARCONI_ALPHAS = (0.5, 1.0, 2.0, 4.0)  # the FLOP-aware experts' alphas
EXPERTS = (*(Expert(b, m) for b in Boundaries for m in EVICTION_NAMES if m is not Mode.MARCONI),
           *(Expert(b, Mode.MARCONI, a) for b in Boundaries for a in MARCONI_ALPHAS))
# `sglang+`'s own configuration (judicious admission, LRU over leaves) as an expert: its
# shadow replays `sglang+` exactly, so marconi+ can always fall back to it
SGLANG_PLUS = Expert(Boundaries.NONE, Mode.LRU)
# marconi+'s: every admission (no boundary, the first, the last, sparse prefix caching's
# positions) with every eviction but LRU, and `sglang+`'s configuration
DEFAULT_EXPERTS = (*(Expert(b, m) for b in Boundaries
                     for m in (Mode.DENSITY, Mode.DEPTH, Mode.FLOP)), SGLANG_PLUS)
# A Transformer (no SSM layer): a node per block and LRU, tail first, is vLLM's block
# cache, which no state-sized policy beats there; nothing to choose.
ATTENTION_ONLY = (Expert(Boundaries.NONE, Mode.LRU),)


def _policies(cache: PrefixCache) -> tuple[Structured, Switchable]:
    """The live cache's admission and eviction (a compiled cache's eviction stands for its
    `Switchable`: its setting reaches the core)."""
    admission, eviction = cache.admission, cache.eviction
    policy = getattr(eviction, "policy", eviction)  # a compiled cache's: its Python policy
    if not isinstance(admission, Structured) or not isinstance(policy, Switchable):
        raise ValueError(f"cache {cache.name!r} cannot run shadow experts: it needs "
                         "Structured admission and Switchable eviction")
    return admission, cast(Switchable, eviction)


def _shadow(cache: PrefixCache, expert: Expert, scale: float = 1.0,
            cold_boundary: bool = True) -> PrefixCache:
    """An empty token-only cache like `cache` (at `scale` of its capacity and state slots)
    that runs `expert` alone: its eviction is the one policy the expert uses, without the
    live cache's other experts (a third of the work and memory; the victims are the same,
    as the others only watch). `cold_boundary`: `ShadowConfig.cold_boundary`."""
    admission, eviction = _policies(cache)
    # frozen config: shared, then replaced; the planner is shared (`OverlapPlanner`)
    shadow_admission = Structured(admission.config, admission.planner)
    _use_boundaries(shadow_admission, expert, cold_boundary)
    slots = cache.layout.state_slots
    layout = Layout(page_size=cache.layout.page_size,
                    state_slots=max(1, round(slots * scale)) if slots else 0)
    return replay_cache(cache.spec, int(cache.capacity * scale), shadow_admission,
                        eviction.solo(expert.mode, expert.alpha),
                        name=f"{cache.name} shadow {expert}", layout=layout)


def apply(cache: PrefixCache, expert: Expert, union: frozenset[Boundaries] | None = None,
          cold_boundary: bool = True) -> None:
    """Make `cache` (a marconi+ cache: Structured admission, Switchable eviction) run
    `expert`, or with `union` (not empty) `expert`'s eviction and every admission of
    `union` at once (each sequence kept whole). Switching is free: every eviction order is
    kept up to date all along. `cold_boundary`: `ShadowConfig.cold_boundary`."""
    admission, eviction = _policies(cache)
    if union:
        admission.use_boundaries(first=Boundaries.FIRST in union,
                                 last=Boundaries.LAST in union,
                                 hedge=Boundaries.OVERLAP in union)
    else:
        _use_boundaries(admission, expert, cold_boundary)
    eviction.set_setting(Setting(expert.mode, expert.alpha))


def _use_boundaries(admission: Structured, expert: Expert, cold_boundary: bool = True) -> None:
    """Make `admission` checkpoint the message boundaries `expert` runs with (the overlap
    expert, with `cold_boundary`: the first where its planner places nothing,
    `Structured._overlap`)."""
    overlap = expert.boundaries is Boundaries.OVERLAP
    admission.use_boundaries(first=expert.boundaries is Boundaries.FIRST
                             or (overlap and cold_boundary),
                             last=expert.boundaries is Boundaries.LAST, overlap=overlap)
