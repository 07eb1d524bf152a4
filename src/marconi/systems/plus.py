"""marconi+ and its ablations: Switchable eviction and structured admission, chosen
online by shadow experts."""

from __future__ import annotations

from marconi.core.spec import ModelSpec
from marconi.core.tuning import Tuner
from marconi.systems.registry import (
    UNBOUNDED_PLANNER,
    Policies,
    System,
    TunerFactory,
    TunerOptions,
    register,
)


def shadows(modes: tuple[str, ...] = ("density", "depth", "flop"),
            boundaries: bool = True, overlap: bool = True, whole_memory: bool = False,
            hedge: bool = False) -> TunerFactory:
    """marconi+'s shadow experts over these eviction modes (and every message boundary
    choice, or none when `boundaries` is False; and the overlap planner's positions when
    `overlap`, its planner keeping every sequence seen when `whole_memory`, else the
    latest `OVERLAP_MEMORY` tokens); with `hedge`, the live cache admits at every
    expert's positions for its first `HEDGE` requests."""

    def make(options: TunerOptions) -> Tuner:
        from marconi.plus.shadows import HEDGE, OVERLAP_MEMORY, shadow_tuner

        return shadow_tuner(modes, boundaries, options.settings,
                            first_boundary=options.first_boundary, overlap=overlap,
                            overlap_memory=None if whole_memory else OVERLAP_MEMORY,
                            hedge=HEDGE if hedge else 0)

    return make


# --- marconi+ and its ablation ----------------------------------------------------------------


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
_plus("marconi+-hedge", "marconi+ whose live cache admits at every expert's positions for its "
      "first 32 requests, so an early switch finds the winner's checkpoints in place",
      shadows(hedge=True))
