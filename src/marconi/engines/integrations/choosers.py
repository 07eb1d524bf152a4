"""What picks an engine's alpha from the requests it finished (docs/integrations.md):
marconi's bootstrap tuner (`Bootstrap`, guarded by a mirror at the engine's own order) or
marconi+'s shadow experts (`Shadows`), each over token-only mirrors of the engine's cache
(on the compiled core where it is built: it runs both engines' policies and layouts,
`marconi.core.compiled`); run by `common.Tuning` in the engine's process or by
`tuner_process` in a child of it."""

from __future__ import annotations

from typing import Any

import numpy as np

from marconi.core.tokens import as_tokens
from marconi.core.tuning import DECIDE_EVERY, DECISIVE_LEAD, Objective, decisive, hit_worth


class Bootstrap:
    """marconi's bootstrap tuner over one mirror of the engine's cache: the alpha it adopts
    at the end of its window, once. And a guard (`guard`), so that marconi does not stay
    below the engine's own order: a second mirror at alpha 0 fed the same requests; once
    the tuner has adopted an alpha other than 0, every `every` requests it compares what
    each mirror saved since (prefill FLOPs, as marconi+'s shadows count them), and when
    alpha 0's leads by more than `lead` of what a cache holding every input would have
    saved since, and by at least one average request's worth of that (`core.tuning.decisive`,
    as marconi+'s shadows decide), it chooses alpha 0, once, and stops guarding."""

    def __init__(self, guard: bool = True, every: int = DECIDE_EVERY,
                 lead: float = DECISIVE_LEAD) -> None:
        if every < 1 or not 0 <= lead <= 1:
            raise ValueError(f"Bootstrap: every must be >= 1 and lead in [0, 1], got "
                             f"{every!r}, {lead!r}")
        self.mirror: Any = None
        self.tuner: Any = None
        self.adopted: float | None = None  # the tuner's alpha
        self.guard, self.every, self.lead = guard, every, lead
        self.stock: Any = None  # the alpha-0 mirror, while it may yet be needed
        self.seen = 0  # requests observed
        self.adopted_at: int | None = None  # requests observed when the tuner adopted
        self.restored_at: int | None = None  # ... when the guard chose alpha 0
        self.since = 0  # requests observed since the tuner adopted (while guarding)
        self.saved = [0.0, 0.0]  # FLOPs saved since then: the adopted alpha's, alpha 0's
        self.possible = 0.0  # FLOPs a cache holding every input would have saved since then
        self.why: str | None = None  # why the last alpha chosen was (the guard's reason)

    def build(self, system: Any, spec: Any, capacity: int, layout: dict[str, Any],
              wait: bool) -> None:
        from marconi.systems import TunerOptions

        self.mirror = system.cache(spec, capacity, replay=True, **layout)
        # tuned once: the guard judges the one alpha adopted (`retune` would move it)
        self.tuner = system.make_tuner(None, TunerOptions(wait=wait,
                                                          settings={"retune": False}))
        if self.guard:
            self.stock = system.cache(spec, capacity, alpha=0.0, replay=True, **layout)

    def observe(self, tokens: np.ndarray, n_input: int) -> float | None:
        self.seen += 1
        hit = self.mirror.lookup(tokens[:n_input]).hit
        self.mirror.commit(tokens, n_input)
        stock = None if self.stock is None else hit_worth(self.stock, tokens, n_input, (),
                                                          Objective.FLOPS)
        self.tuner.observe(self.mirror, tokens, n_input)
        if self.adopted is None:
            if not self.tuner.done:
                return None
            self.adopted, self.adopted_at = float(self.mirror.alpha), self.seen
            if self.adopted == 0.0:
                self.stock = None  # the engine's own order: nothing to guard
            return self.adopted
        if stock is None:
            return None
        return self._guard(float(self.mirror.spec.flops(hit)), stock, n_input)

    def _guard(self, mine: float, stock: float, n_input: int) -> float | None:
        """Add one request after the adoption to the books; alpha 0 when its mirror leads
        decisively at a decision point."""
        self.since += 1
        self.saved[0] += mine
        self.saved[1] += stock
        self.possible += float(self.mirror.spec.flops(n_input))
        if self.since % self.every:
            return None
        lead = self.saved[1] - self.saved[0]
        if not decisive(lead, self.possible, self.since, self.lead):
            return None
        self.restored_at, self.stock = self.seen, None  # once: guarding stops here
        self.why = (f"its guard: alpha 0 (the engine's own order) saved "
                    f"{100 * lead / self.possible:.2f}% of the possible prefill FLOPs more "
                    f"than alpha {self.adopted:g} in the {self.since} requests since alpha "
                    f"{self.adopted:g} was adopted (bound: more than "
                    f"{100 * self.lead:g}% and one average request's worth)")
        return 0.0

    def status(self) -> str:
        return "tuned" if self.adopted is not None else "untuned"

    def report(self) -> dict[str, Any]:
        """The guard's books (`alpha_why`: why the last alpha was chosen, where the guard
        chose it)."""
        guard = {"on": self.guard, "every": self.every, "lead": self.lead,
                 "adopted": self.adopted, "adopted_at": self.adopted_at,
                 "since": self.since, "saved_adopted": self.saved[0],
                 "saved_alpha0": self.saved[1], "possible": self.possible,
                 "restored": self.restored_at is not None, "restored_at": self.restored_at}
        return {"guard": guard, **({"alpha_why": self.why} if self.why else {})}


# marconi+'s experts in an engine: the engine's own order (alpha 0) and Marconi's score
# at marconi+'s fixed alphas; admission stays the engine's (docs/integrations.md)
ENGINE_ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0)
# the lead a leader needs over the running expert in the first 128 requests: a quarter,
# where marconi+'s simulator tuner asks the same 5% as after them. Its experts here are
# evictions, free to switch back, and at 5% the engine followed early noise (vLLM on
# ShareGPT at 1 GB: ratio 1.097 -> 1.091, benchmarks/RESULTS.md)
ENGINE_WARMUP_LEAD = 0.25


class Shadows:
    """marconi+'s shadow experts over mirrors of the engine's cache: one token-only mirror
    per expert (`alphas`), each fed every finished request; every `config.every` requests
    the engine switches to the expert whose mirror saved the most FLOPs so far when it
    leads the running one decisively (`plus.switching.leader`, marconi+'s own rule, with a
    quarter's lead in the first 128 requests: `ENGINE_WARMUP_LEAD`). The first expert (the
    engine's own order) runs until then."""

    def __init__(self, alphas: tuple[float, ...] = ENGINE_ALPHAS, config: Any = None) -> None:
        from marconi.plus.shadows import ShadowConfig

        self.alphas = alphas
        self.config = config if config is not None else ShadowConfig(
            sample_after=None, early_threshold=ENGINE_WARMUP_LEAD)
        self.mirrors: list[Any] = []
        self.totals = np.zeros(len(alphas))
        self.current, self.seen = 0, 0
        self.switches: list[tuple[int, float]] = []

    def build(self, system: Any, spec: Any, capacity: int, layout: dict[str, Any],
              wait: bool) -> None:
        self.mirrors = [system.cache(spec, capacity, alpha=a, replay=True, **layout)
                        for a in self.alphas]

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
