"""Named systems: each a bundle of an admission and an eviction policy (DESIGN section 5).

```python
system = get_system("marconi")
admission, eviction = system.admission(), system.eviction(spec, alpha=0.0)
```
New systems register with `register`; everything that lists systems (CLI choices,
comparisons, tests parametrized over the registry) reads `SYSTEMS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marconi.policies.admission import Admission, Block, Judicious, NoAdmission
from marconi.policies.eviction import (
    Action,
    Eviction,
    FlopAware,
    LRULeaf,
    Pressure,
    Recency,
    Victim,
    check_alpha,
)
from marconi.spec import ModelSpec

EvictionFactory = Callable[[ModelSpec, float], Eviction]


@dataclass(frozen=True, slots=True, kw_only=True)
class System:
    """A named caching system."""

    name: str  # what users type: --system NAME
    admission: Callable[[], Admission]  # fresh admission policy per cache
    eviction: EvictionFactory  # (spec, alpha) -> fresh eviction policy
    tuned: bool = False  # alpha chosen by the bootstrap tuner unless given
    uses_alpha: bool = False  # whether alpha means anything to this system
    description: str = ""  # one line for --help and docs
    tuner: Callable[..., Any] | None = None  # tuner factory; None: the bootstrap tuner


SYSTEMS: dict[str, System] = {}


def register(system: System) -> System:
    if system.name in SYSTEMS:
        raise ValueError(f"system {system.name!r} is already registered")
    SYSTEMS[system.name] = system
    return system


def get_system(name: str | System) -> System:
    """The registered system called `name`, or ValueError listing the known ones."""
    if isinstance(name, System):
        return name
    try:
        return SYSTEMS[name]
    except (KeyError, TypeError):
        known = ", ".join(SYSTEMS)
        raise ValueError(f"unknown system {name!r}; known systems: {known}") from None


register(System(
    name="vanilla", admission=NoAdmission, eviction=lambda spec, alpha: LRULeaf(),
    description="no prefix caching"))
register(System(
    name="vllm+", admission=lambda: Block(32),
    eviction=lambda spec, alpha: LRULeaf(deepest_first=True),
    description="paper baseline: a checkpoint every 32-token block, LRU over blocks"))
register(System(
    name="sglang+", admission=Judicious, eviction=lambda spec, alpha: LRULeaf(),
    description="paper baseline: judicious admission, LRU over leaves"))
register(System(
    name="marconi", admission=Judicious, eviction=lambda spec, alpha: FlopAware(spec, alpha),
    tuned=True, uses_alpha=True,
    description="the paper: judicious admission, FLOP-aware eviction, bootstrap alpha"))
register(System(
    name="marconi-inverse-age", admission=Judicious,
    eviction=lambda spec, alpha: FlopAware(spec, alpha, Recency.INVERSE_AGE),
    tuned=True, uses_alpha=True,
    description="marconi with the artifact's recency 1/(now - t + 1)"))

# importing these registers today's engines (peers) and marconi+ (plus_systems)
from marconi.policies import peers, plus_systems  # noqa: E402,F401

__all__ = [
    "SYSTEMS",
    "Action",
    "Admission",
    "Block",
    "Eviction",
    "FlopAware",
    "Judicious",
    "LRULeaf",
    "NoAdmission",
    "Pressure",
    "Recency",
    "System",
    "Victim",
    "check_alpha",
    "get_system",
    "register",
]
