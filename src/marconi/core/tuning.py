"""What a tuner is to the code that drives a cache, and the one way requests are scored.

A tuner watches the requests a cache serves and changes its policies' knobs (Marconi's
alpha, marconi+'s expert). The cache never calls it: the driver (the simulator, the
concurrent replay, the engine) calls `observe` after each commit, so a commit's cost is
the cache's own. `report` says what the tuner did, for `simulate --json`.

```
driver: plan = cache.lookup(input) ... cache.commit(input + output) -> tuner.observe(...)
```
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Protocol

import numpy as np

from marconi.core.tokens import as_tokens

if TYPE_CHECKING:
    from marconi.core.cache import PrefixCache

class TuningReport(Protocol):
    """What a tuner did: each kind of tuner has its own typed report."""

    def to_json(self) -> dict[str, object]:
        """For `simulate --json`: numbers, strings, lists, dicts."""


class Objective(Enum):
    FLOPS = "flops"  # prefill FLOPs saved (what the paper's artifact optimizes)
    TOKENS = "tokens"  # hit tokens (what the paper's text says)


class Tuner(Protocol):
    def observe(self, cache: PrefixCache, tokens: np.ndarray, n_input: int,
                boundaries: Sequence[int] = (), session: str | None = None, *,
                arrival: float | None = None) -> None:
        """Called by the driver after `cache.commit(tokens, n_input)`; `session` names the
        request's session where the driver knows it (the simulator does, the engine not);
        `arrival`, the time the request was issued, where the driver serves overlapping
        requests (the serving replay: a tuner replays its window the same way)."""

    def report(self) -> TuningReport | None:
        """What the tuner did so far (None if nothing yet)."""

    def start(self, cache: PrefixCache) -> None:
        """Set `cache` up before its first request, where the driver wants its first
        requests served by the tuner's first choice (a server); otherwise the first
        `observe` does it."""


# how often a tuner that compares replays decides (requests), and the share of what a
# cache holding every input would have saved that a replay's lead must exceed to be
# decisive: marconi+'s shadows (`plus.switching.ShadowConfig`) and, in an engine, the
# bootstrap tuner's guard (`integrations.choosers.Bootstrap`)
# the alphas Marconi's bootstrap tuner replays (`paper.tuner.GRID`): 0, 0.1, ..., 2.0
ALPHA_GRID = tuple(round(0.1 * i, 1) for i in range(21))
DECIDE_EVERY = 16
# requests a re-tuning bootstrap tuner's window holds at most (`marconi.paper.tuner`)
RETUNE_WINDOW = 250
DECISIVE_LEAD = 0.001


def decisive(lead: float, possible: float, seen: int, share: float) -> bool:
    """Whether one replay's `lead` over another's (objective totals over `seen` requests)
    is decisive: more than `share` of `possible` (a cache holding every input's total) and
    than one average request's worth of it (`possible / seen`): on a handful of requests
    a few hits are noise."""
    return bool(lead > max(possible * share, possible / max(seen, 1)))


def hit_worth(cache: PrefixCache, tokens: np.ndarray | bytes, n_input: int,
              boundaries: Sequence[int], objective: Objective) -> float:
    """One request served through a token-only cache (`PrefixCache.serve`: lookup, then
    commit input + output), and what its hit is worth under `objective` (the unit every
    replay sums). `tokens`: an array, or checked int32 bytes (`as_tokens(...).tobytes()`)
    when one request feeds many caches."""
    key = tokens if isinstance(tokens, bytes) else as_tokens(tokens).tobytes()
    hit = cache.serve(key, n_input, boundaries)
    return cache.spec.flops(hit) if objective is Objective.FLOPS else float(hit)
