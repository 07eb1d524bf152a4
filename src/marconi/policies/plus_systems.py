"""Registers `marconi+` and its ablations (issue 8); see `policies/plus.py`.

Each ablation turns one piece off, so `marconi compare --systems` shows what each pays:
`marconi+-no-structure` (plain judicious admission), `marconi+-no-lru` (the guarded,
re-tuning tuner over FLOP-aware alphas only), `marconi+-once` (tuned once, no re-tuning).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from marconi.policies import System, register
from marconi.policies.plus import Mode, Setting, StructureConfig, Structured, Switchable


def _tuner(*, lru: bool = True, **changes: object) -> Callable[..., object]:
    """A factory of guarded tuners (imported late: the tuner imports the cache)."""

    def make(multiplier: int = 5, objective: str = "flops") -> object:
        from marconi.retuner import GuardedTuner, RetuneConfig
        from marconi.tuner import Objective

        config = replace(RetuneConfig(multiplier=multiplier, objective=Objective(objective)),
                         **changes)  # type: ignore[arg-type]
        if not lru:
            flop = tuple(s for s in config.candidates if s.mode is Mode.FLOP)
            config = replace(config, candidates=flop, initial=Setting(Mode.FLOP, 0.0))
        return GuardedTuner(config)

    return make


def _plus(name: str, description: str, *, structure: StructureConfig | None = None,
          lru: bool = True, **tuning: object) -> System:
    config = structure or StructureConfig()
    return register(System(
        name=name, admission=lambda: Structured(config),
        eviction=lambda spec, alpha: Switchable(spec, alpha), tuned=True, uses_alpha=True,
        tuner=_tuner(lru=lru, **tuning), description=description))


MARCONI_PLUS = _plus(
    "marconi+", "Marconi + message-boundary and partial-hit admission, guarded re-tuning "
    "with LRU among the candidates")
_plus("marconi+-no-structure", "marconi+ with plain judicious admission",
      structure=StructureConfig(boundaries=0, partial=False))
_plus("marconi+-no-lru", "marconi+ without the LRU candidate (FLOP-aware only)",
      lru=False)
_plus("marconi+-once", "marconi+ tuned once (no periodic re-tuning, no guard)",
      periodic=False, threshold=0.0)
