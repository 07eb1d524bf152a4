"""What picks an engine's alpha from the requests it finished (docs/integrations.md):
marconi's bootstrap tuner (`Bootstrap`) or marconi+'s shadow experts (`Shadows`), each over
token-only mirrors of the engine's cache; run by `common.Tuning` in the engine's process
or by `tuner_process` in a child of it."""

from __future__ import annotations

from typing import Any

import numpy as np

from marconi.core.tokens import as_tokens
from marconi.core.tuning import hit_worth


class Bootstrap:
    """marconi's bootstrap tuner over one mirror of the engine's cache: the alpha it adopts
    at the end of its window, once."""

    def __init__(self) -> None:
        self.mirror: Any = None
        self.tuner: Any = None
        self.adopted: float | None = None

    def build(self, system: Any, spec: Any, capacity: int, layout: dict[str, Any],
              wait: bool) -> None:
        from marconi.systems import TunerOptions

        self.mirror = system.cache(spec, capacity, **layout)
        self.tuner = system.make_tuner(None, TunerOptions(wait=wait))

    def observe(self, tokens: np.ndarray, n_input: int) -> float | None:
        self.mirror.lookup(tokens[:n_input])
        self.mirror.commit(tokens, n_input)
        self.tuner.observe(self.mirror, tokens, n_input)
        if self.tuner.done and self.adopted is None:
            self.adopted = float(self.mirror.alpha)
            return self.adopted
        return None

    def status(self) -> str:
        return "tuned" if self.adopted is not None else "untuned"

    def report(self) -> dict[str, Any]:
        return {}


# marconi+'s experts in an engine: the engine's own order (alpha 0) and Marconi's score
# at marconi+'s fixed alphas; admission stays the engine's (docs/integrations.md)
ENGINE_ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0)


class Shadows:
    """marconi+'s shadow experts over mirrors of the engine's cache: one token-only mirror
    per expert (`alphas`), each fed every finished request; every `config.every` requests
    the engine switches to the expert whose mirror saved the most FLOPs so far when it
    leads the running one decisively (`plus.shadows.leader`, marconi+'s own rule). The
    first expert (the engine's own order) runs until then."""

    def __init__(self, alphas: tuple[float, ...] = ENGINE_ALPHAS, config: Any = None) -> None:
        from marconi.plus.shadows import ShadowConfig

        self.alphas = alphas
        self.config = config if config is not None else ShadowConfig(sample_after=None)
        self.mirrors: list[Any] = []
        self.totals = np.zeros(len(alphas))
        self.current, self.seen = 0, 0
        self.switches: list[tuple[int, float]] = []

    def build(self, system: Any, spec: Any, capacity: int, layout: dict[str, Any],
              wait: bool) -> None:
        self.mirrors = [system.cache(spec, capacity, alpha=a, **layout) for a in self.alphas]

    def observe(self, tokens: np.ndarray, n_input: int) -> float | None:
        key = as_tokens(tokens, what="observe: tokens").tobytes()
        for k, mirror in enumerate(self.mirrors):
            self.totals[k] += hit_worth(mirror, key, n_input, (), self.config.objective)
        self.seen += 1
        if self.seen % self.config.every:
            return None
        from marconi.plus.shadows import leader  # (marconi+ loaded only where it runs)

        best = leader(self.totals, self.current, self.seen, self.config)
        if best == self.current:
            return None
        self.current = best
        self.switches.append((self.seen, self.alphas[best]))
        return self.alphas[best]

    def status(self) -> str:
        return "tuned" if self.seen >= self.config.every else "untuned"

    def report(self) -> dict[str, Any]:
        return {"experts": [f"alpha {a:g}" for a in self.alphas],
                "switches": [[at, a] for at, a in self.switches],
                "totals": [float(t) for t in self.totals]}
