"""marconi+'s switching rule: the settings it runs at (`ShadowConfig`: when the shadows'
record is read, how decisive a lead must be, sampling, the hedge) and which expert runs
next (`leader`: the guard, then the leader on a relative or a clear lead, then `sglang+`'s
configuration on a smaller one). `shadows.ShadowTuner` applies it to the live cache; the
engines' chooser (`integrations.choosers.Shadows`) shares `leader`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marconi.core.tuning import DECIDE_EVERY, DECISIVE_LEAD, Objective, decisive
from marconi.plus.experts import DEFAULT_EXPERTS, OVERLAP_MEMORY, Expert


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowConfig:
    experts: tuple[Expert, ...] = DEFAULT_EXPERTS  # the first runs until a leader emerges
    every: int = DECIDE_EVERY  # requests between decisions
    # requests between decisions from `settle` to `warmup`; before `settle` the leader is
    # looked for after every request: one found at request 3 is followed at 3, not at 16
    # or 32 (on 100-request traces the requests run by the wrong expert before the first
    # decisions were the whole regret)
    early_every: int = 4
    threshold: float = 0.05  # relative lead the leader needs over the running expert
    # `sglang+`'s configuration (`SGLANG_PLUS`) is followed on a smaller lead: this share
    # of what a cache holding every input would save (the objective's total over the
    # requests seen), however small against the running expert's total: marconi+ trails
    # `sglang+` by at most about this much (docs/architecture.md, "marconi+'s regret")
    lead: float = DECISIVE_LEAD
    # any leader is followed, in the warmup too, once it leads by this share of the
    # possible (two points: no near-tie between experts, however small the totals are)
    clear_lead: float = 0.02
    # requests before the absolute leads and the guard apply (the relative rule alone
    # decides before: a few requests' hits are noise)
    settle: int = 32
    warmup: int = 128  # requests before the lead rule applies (early totals: a few hits)
    # lead needed during warmup: the same 5% as after it (a quarter followed RAG's
    # placement and a Mooncake window's last boundary late; the engines' chooser keeps
    # `integrations.choosers.ENGINE_WARMUP_LEAD`: experiments/RESULTS.md)
    early_threshold: float = 0.05
    objective: Objective = Objective.FLOPS
    # None: decide on each shadow's whole record; H: on its record with every request's
    # saving weighted 2^(-age / H) (a recent leader is followed; ages in requests)
    half_life: float | None = None
    # after this many requests (None: never) the shadows see a `sample_rate` share of the
    # sessions at `sample_rate` of the capacity (where the driver names sessions); the
    # simulator passes its run setting `shadow_sample_after` (`tuner`)
    sample_after: int | None = None
    sample_rate: float = 0.125
    # tokens of the sequences seen the overlap planner keeps (None: every one; a replay's
    # `marconi+-overlap`): older ones are forgotten, so a server's memory stays bounded
    overlap_memory: int | None = OVERLAP_MEMORY
    # requests during which the live cache admits at every position any expert's
    # admission would (their union), whichever expert runs, until a commit is refused:
    # until the shadows tell which admission pays, a switch finds the winner's early
    # checkpoints in place (0: never, marconi+; `marconi+-hedge`: HEDGE)
    hedge: int = 0
    # where its planner places nothing for an input, the overlap expert checkpoints the
    # input's first message boundary (`Structured._overlap`); off: it never checkpoints a
    # message boundary (`marconi+-no-boundaries`)
    cold_boundary: bool = True

    def decides(self, seen: int) -> bool:
        """Whether the leader is looked for after `seen` requests."""
        every = 1 if seen < self.settle else self.early_every if seen < self.warmup \
            else self.every
        return seen % every == 0

    def __post_init__(self) -> None:
        if not self.experts:
            raise ValueError("ShadowConfig.experts must not be empty")
        if self.every < 1 or self.early_every < 1:
            raise ValueError(f"ShadowConfig.every and early_every must be >= 1, got "
                             f"{self.every!r}, {self.early_every!r}")
        if self.warmup < 0 or self.early_threshold < 0 or self.settle < 0 or self.hedge < 0:
            raise ValueError("ShadowConfig.warmup, early_threshold, settle and hedge must be "
                             f">= 0, got {self.warmup!r}, {self.early_threshold!r}, "
                             f"{self.settle!r}, {self.hedge!r}")
        if self.threshold < 0:
            raise ValueError(f"ShadowConfig.threshold must be >= 0, got {self.threshold!r}")
        if not (0 <= self.lead <= 1 and 0 <= self.clear_lead <= 1):
            raise ValueError("ShadowConfig.lead and clear_lead must be in [0, 1], got "
                             f"{self.lead!r}, {self.clear_lead!r}")
        if self.half_life is not None and not self.half_life > 0:
            raise ValueError(f"ShadowConfig.half_life must be > 0, got {self.half_life!r}")
        if self.sample_after is not None and self.sample_after < 0:
            raise ValueError("ShadowConfig.sample_after must be >= 0 or None, got "
                             f"{self.sample_after!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError("ShadowConfig.sample_rate must be in (0, 1], got "
                             f"{self.sample_rate!r}")


def leader(score: np.ndarray, current: int, seen: int, config: ShadowConfig,
           possible: float = 0.0, safe: int | None = None, live: float | None = None) -> int:
    """The expert to run after `seen` requests. First the guard: the `safe` expert
    (`sglang+`'s configuration) while the live cache's own record (`live`) trails its
    shadow by more than `config.lead` x `possible` (the objective's total over the
    requests seen), whatever the other shadows say (they never paid a switch; the live
    cache did). Else the best-scoring one when it leads the running one (`current`) by
    `config.threshold` (by `early_threshold` in the first `warmup` requests) or by
    `config.clear_lead` x `possible`; else the `safe` expert when its shadow leads the
    running one's by `config.lead` x `possible`; else the running one. A lead measured on
    `possible` must also be worth a whole request on average (`possible / seen`): on a
    handful of requests a few hits are noise."""
    threshold = config.threshold if seen >= config.warmup else config.early_threshold
    best = int(np.argmax(score))
    lead = score[best] - score[current]
    if seen < config.settle:
        return best if lead > score[current] * threshold else current
    if safe is not None and live is not None \
            and decisive(score[safe] - live, possible, seen, config.lead):
        return safe
    if lead > score[current] * threshold \
            or (possible > 0 and decisive(lead, possible, seen, config.clear_lead)):
        return best
    if safe is not None and decisive(score[safe] - score[current], possible, seen, config.lead):
        return safe
    return current
