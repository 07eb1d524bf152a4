"""Registers `marconi+` and the variants its ablation compares (issue 8).

- `marconi+`: GreedyDual-FLOP eviction (no alpha) with an LRU twin, Marconi's admission
  plus message-boundary checkpoints, and shadow experts (`marconi.shadows`) choosing
  among {no boundary, first boundary, last boundary} x {GreedyDual-FLOP, LRU}.
- `marconi+-gd`: GreedyDual-FLOP eviction with Marconi's admission, nothing adaptive.
- `marconi+-no-lru` / `marconi+-no-boundaries`: shadow experts without the LRU
  fallback / without boundary checkpoints.
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


def _shadow_tuner(mode: Mode | None = None, boundaries: bool = True) -> Callable[..., object]:
    """A factory of shadow tuners over the experts that pass the filters (imported late:
    the tuner imports the cache)."""

    def make(multiplier: int = 5, objective: str = "flops") -> object:
        from marconi.shadows import EXPERTS, Boundaries, ShadowConfig, ShadowTuner
        from marconi.tuner import Objective

        experts = tuple(e for e in EXPERTS if (mode is None or e.mode is mode)
                        and (boundaries or e.boundaries is Boundaries.NONE))
        return ShadowTuner(ShadowConfig(experts=experts, objective=Objective(objective)))

    return make


def _guarded_tuner(multiplier: int = 5, objective: str = "flops") -> object:
    from marconi.retuner import GuardedTuner, RetuneConfig
    from marconi.tuner import Objective

    return GuardedTuner(replace(RetuneConfig(multiplier=multiplier),
                                objective=Objective(objective)))


def _greedy_dual(spec: object, alpha: float) -> Switchable:
    return Switchable(spec, 0.0, Mode.FLOP, Recency.GREEDY_DUAL)  # type: ignore[arg-type]


def _plus(name: str, description: str, tuner: Callable[..., object] | None) -> System:
    return register(System(
        name=name, admission=lambda: Structured(PLAIN), eviction=_greedy_dual,
        tuned=tuner is not None, tuner=tuner, description=description))


MARCONI_PLUS = _plus(
    "marconi+", "GreedyDual-FLOP eviction and message-boundary admission, chosen online "
    "by shadow experts (with LRU as a fallback)", _shadow_tuner())
_plus("marconi+-gd", "marconi+ without shadow experts: GreedyDual-FLOP, judicious admission",
      None)
_plus("marconi+-no-lru", "marconi+ without the LRU experts", _shadow_tuner(mode=Mode.FLOP))
_plus("marconi+-no-boundaries", "marconi+ without boundary checkpoints",
      _shadow_tuner(boundaries=False))
register(System(
    name="marconi+-guarded", admission=lambda: Structured(StructureConfig()),
    eviction=lambda spec, alpha: Switchable(spec, alpha), tuned=True, uses_alpha=True,
    tuner=_guarded_tuner, description="first marconi+ design: FLOP-aware eviction re-tuned "
    "on sliding windows with a guard, LRU among the candidates"))

__all__ = ["MARCONI_PLUS", "Setting"]
