"""`configure`: the one place a front end (the CLI, a sweep's cell, `marconi.api`) builds
the `SimConfig` of a replay from run settings given by name (docs/architecture.md,
"Settings").

```python
config = configure(model="paper-7b", capacity="2GB", system="marconi", multiplier=10)
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from marconi.core.spec import ModelSpec, model_from
from marconi.settings import RUN, Setting, by_name
from marconi.sim.capacity import check_capacity
from marconi.sim.latency import LatencyModel
from marconi.sim.result import REPLAY_SETTINGS, SimConfig
from marconi.workload.options import TRACE_SETTINGS

SETTINGS: dict[str, Setting] = by_name((*TRACE_SETTINGS, *REPLAY_SETTINGS))  # every run setting


def configure(*, model: str | ModelSpec, capacity: int | str, system: str,
              alpha: float | None = None, latency: LatencyModel | None = None,
              **settings: Any) -> SimConfig:
    """The replay of `system` on `model` (a preset string, a Hugging Face config.json, or a
    `ModelSpec`) at `capacity`, with replay settings (`REPLAY_SETTINGS`) by name; ValueError
    naming a setting that is unknown or not a replay setting, or a value it does not take."""
    unknown(settings, [s.name for s in REPLAY_SETTINGS], "replay setting")
    RUN["alpha"].check(alpha)
    spec = model if isinstance(model, ModelSpec) else model_from(model)
    return SimConfig(spec=spec, capacity=check_capacity(spec, capacity, system), system=system,
                     alpha=alpha, latency=latency, **settings)


def unknown(given: Iterable[str], known: Sequence[str], what: str) -> None:
    """ValueError naming every name in `given` that is not `known`."""
    extra = sorted(set(given) - set(known))
    if extra:
        raise ValueError(f"unknown {what}{'s' if len(extra) > 1 else ''} "
                         f"{', '.join(map(repr, extra))}; known: {', '.join(known)}")


def split(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """`values` as (trace settings, replay settings, the rest)."""
    trace = {k: v for k, v in values.items() if k in by_name(TRACE_SETTINGS)}
    replay = {k: v for k, v in values.items() if k in by_name(REPLAY_SETTINGS)}
    rest = {k: v for k, v in values.items() if k not in trace and k not in replay}
    return trace, replay, rest
