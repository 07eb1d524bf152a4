"""Registers `marconi+` and the variants its ablation compares (issue 8).

- `marconi+`: hit-density eviction with depth-classed hit-density, GreedyDual-FLOP (and
  LRU) twins, Marconi's admission plus message-boundary checkpoints, and shadow experts
  (`marconi.shadows`) choosing among {no, first, last boundary} x {hit density, hit
  density by depth, GreedyDual-FLOP}.
- `marconi+-density` / `marconi+-depth` / `marconi+-gd`: one eviction alone (hit density
  / hit density by depth / GreedyDual-FLOP) with Marconi's admission, nothing adaptive.
- `marconi+-no-depth` / `marconi+-no-gd` / `marconi+-no-density` /
  `marconi+-no-boundaries`: shadow experts without the depth-classed experts (the
  previous design) / without the GreedyDual-FLOP experts / without hit density at all
  (the design before: GreedyDual-FLOP and LRU experts) / without boundary checkpoints.
- `marconi+-guarded`: the first design, kept for the record: FLOP-aware eviction re-tuned
  by replaying sliding windows from snapshots with a guard (`marconi.retuner`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from marconi.policies import System, register
from marconi.policies.eviction import Recency
from marconi.policies.plus import Mode, Setting, StructureConfig, Structured, Switchable

PLAIN = StructureConfig(boundaries=0, partial=False)  # judicious; experts add boundaries


def _shadow_tuner(modes: tuple[Mode, ...] = (Mode.DENSITY, Mode.DEPTH, Mode.FLOP),
                  boundaries: bool = True) -> Callable[..., object]:
    """A factory of shadow tuners over the experts with these eviction modes (imported
    late: the tuner imports the cache)."""

    def make(multiplier: int = 5, objective: str = "flops") -> object:
        from marconi.shadows import EXPERTS, Boundaries, ShadowConfig, ShadowTuner
        from marconi.tuner import Objective

        experts = tuple(e for e in EXPERTS if e.mode in modes
                        and (boundaries or e.boundaries is Boundaries.NONE))
        return ShadowTuner(ShadowConfig(experts=experts, objective=Objective(objective)))

    return make


def _guarded_tuner(multiplier: int = 5, objective: str = "flops") -> object:
    from marconi.retuner import GuardedTuner, RetuneConfig
    from marconi.tuner import Objective

    return GuardedTuner(replace(RetuneConfig(multiplier=multiplier),
                                objective=Objective(objective)))


def _switchable(mode: Mode, depth: bool) -> Callable[[object, float], Switchable]:
    """Switchable eviction starting in `mode`, its FLOP order GreedyDual-FLOP (no alpha),
    with the depth-classed twin only if something may switch to it (`depth`)."""

    def make(spec: object, alpha: float) -> Switchable:
        return Switchable(spec, 0.0, mode, Recency.GREEDY_DUAL,  # type: ignore[arg-type]
                          depth=depth)

    return make


def _plus(name: str, description: str, tuner: Callable[..., object] | None,
          mode: Mode = Mode.DENSITY, depth: bool = True) -> System:
    return register(System(
        name=name, admission=lambda: Structured(PLAIN), eviction=_switchable(mode, depth),
        tuned=tuner is not None, tuner=tuner, description=description))


MARCONI_PLUS = _plus(
    "marconi+", "hit-density eviction (leaves in one class or by depth), GreedyDual-FLOP "
    "and message-boundary admission, chosen online by shadow experts", _shadow_tuner())
_plus("marconi+-density", "hit-density eviction alone, judicious admission", None,
      depth=False)
_plus("marconi+-depth", "hit-density eviction with leaves classed by depth alone, "
      "judicious admission", None, Mode.DEPTH)
_plus("marconi+-gd", "GreedyDual-FLOP eviction alone, judicious admission", None, Mode.FLOP,
      depth=False)
_plus("marconi+-no-depth", "marconi+ without the depth-classed experts (the previous design)",
      _shadow_tuner(modes=(Mode.DENSITY, Mode.FLOP)), depth=False)
_plus("marconi+-no-gd", "marconi+ without the GreedyDual-FLOP experts",
      _shadow_tuner(modes=(Mode.DENSITY, Mode.DEPTH)))
_plus("marconi+-no-density", "marconi+ without hit density (the design before: "
      "GreedyDual-FLOP and LRU experts)", _shadow_tuner(modes=(Mode.FLOP, Mode.LRU)),
      Mode.FLOP, depth=False)
_plus("marconi+-no-boundaries", "marconi+ without boundary checkpoints",
      _shadow_tuner(boundaries=False))
register(System(
    name="marconi+-guarded", admission=lambda: Structured(StructureConfig()),
    eviction=lambda spec, alpha: Switchable(spec, alpha, depth=False), tuned=True,
    uses_alpha=True,
    tuner=_guarded_tuner, description="first marconi+ design: FLOP-aware eviction re-tuned "
    "on sliding windows with a guard, LRU among the candidates"))

__all__ = ["MARCONI_PLUS", "Setting"]
