"""Guarded sliding-window re-tuning for `marconi+` (issue 8).

Marconi's bootstrap tunes alpha once, from one window, and adopts the best alpha even
when it is barely (or not) better than what runs. This tuner:

- starts in LRU-leaf mode (SGLang+), so before its first replay it behaves like SGLang+;
- tunes on windows back to back: snapshot, record `window` requests, replay them from
  the snapshot under every candidate, snapshot again (periodic re-tuning); a window is
  cut short when its hit rate falls well below the previous window's (a workload shift);
- replays LRU-leaf among the candidates, so it can fall back to SGLang+'s behaviour;
- guards: keeps the current setting unless a candidate beats it on the replay by more
  than `threshold` (relative), so noise cannot make things worse.

```
| before 1st eviction | window 1 (LRU) | window 2 (best of 1) | window 3 ...
                      ^snapshot        ^replay 1, snapshot    ^replay 2, snapshot
```
Replays run on any `concurrent.futures.Executor` (`wait=False`: never blocks lookups).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from marconi.policies.plus import Mode, Setting, Switchable
from marconi.retune_replay import (
    PlusSnapshot,
    Shadows,
    Window,
    advance,
    replay_settings,
    start_shadows,
    take_plus,
)
from marconi.tuner import GRID, Objective

if TYPE_CHECKING:
    from marconi.cache import PrefixCache

T = TypeVar("T")
LRU = Setting(Mode.LRU)  # SGLang+'s behaviour
CANDIDATES = (LRU, *(Setting(Mode.FLOP, a) for a in GRID))


@dataclass(frozen=True, slots=True, kw_only=True)
class RetuneConfig:
    multiplier: int = 5  # first window = multiplier x requests before the first eviction
    min_window: int = 32  # windows never shorter (few requests: noisy replays)
    max_window: int = 2000  # nor longer (stale snapshots; bounded replay cost)
    threshold: float = 0.01  # adopt only a relative replay gain above this
    drop: float = 0.3  # cut a window when its hit rate < (1 - drop) x the previous one's
    periodic: bool = True  # False: tune once, like Marconi's bootstrap
    horizon: int = 1  # windows whose replay scores are summed to decide (0: all so far)
    shadow: bool = False  # score persistent shadow caches (True) or replays from snapshots
    objective: Objective = Objective.FLOPS
    candidates: tuple[Setting, ...] = CANDIDATES
    initial: Setting = LRU  # what runs before the first replay

    def __post_init__(self) -> None:
        if self.multiplier < 1 or self.min_window < 1 or self.max_window < self.min_window:
            raise ValueError("need multiplier >= 1 and 1 <= min_window <= max_window")
        if self.threshold < 0 or not 0 <= self.drop <= 1:
            raise ValueError(f"threshold must be >= 0 and drop in [0, 1], got "
                             f"{self.threshold!r}, {self.drop!r}")
        if not self.candidates:
            raise ValueError("need at least one candidate setting")


@dataclass(slots=True)
class Retune:
    """One finished replay: when, over how many requests, scores, the decision."""

    at: int  # commits seen when the window closed
    window: int
    scores: dict[Setting, float] = field(default_factory=dict)
    before: Setting = LRU
    chosen: Setting = LRU
    seconds: float = 0.0  # replay wall time, summed over workers

    def as_dict(self) -> dict[str, object]:
        return {"at": self.at, "window": self.window, "before": str(self.before),
                "chosen": str(self.chosen), "seconds": self.seconds,
                "scores": {str(s): v for s, v in self.scores.items()}}


class GuardedTuner:
    """Re-tunes a `Switchable` cache's eviction setting; see the module docstring."""

    def __init__(self, config: RetuneConfig | None = None, *, executor: Executor | None = None,
                 wait: bool = True) -> None:
        self.config = config or RetuneConfig()
        self.executor = executor
        self.wait = wait
        self.history: list[Retune] = []
        self._snapshot: PlusSnapshot | None = None
        self._recorded: list[Window] = []
        self._window = 0
        self._pending: tuple[Retune, list[Future[Any]]] | None = None
        self._recording = False  # a window is open
        self._rates: list[float] = []  # token hit rate of each closed window
        self._counts = (0, 0)  # stats (hit tokens, input tokens) at the window start
        self._started = False
        self._shadows: Shadows | None = None  # persistent shadow caches (config.shadow)
        self._totals: dict[Setting, float] = {}  # shadow scores summed since they started

    @property
    def busy(self) -> bool:
        """A replay is in flight."""
        return self._pending is not None

    def observe(self, cache: PrefixCache, tokens: np.ndarray, n_input: int,
                boundaries: Sequence[int] = ()) -> None:
        """Called by the cache after every commit; never blocks unless `wait`."""
        if not self._started:
            self._started = True
            _setting(cache, self.config.initial)
        if self._pending is not None:
            self._adopt_if_ready(cache)
        if not self._recording:
            if cache.stats.evictions and (self.config.periodic or not self.history):
                self._open(cache)
            return
        self._recorded.append((tokens, n_input, tuple(boundaries)))
        full = len(self._recorded) >= self._window or self._dropped(cache)
        if full and self._pending is None:  # while a replay runs, the window grows
            self._close(cache)

    def _open(self, cache: PrefixCache) -> None:
        if not self._window:
            n0 = cache.stats.commits
            self._window = int(np.clip(self.config.multiplier * n0, self.config.min_window,
                                       self.config.max_window))
        self._recording = True
        if self._shadows is None:  # shadows, once started, need no snapshots
            self._snapshot = take_plus(cache)
        if self.config.shadow and self._shadows is None:
            settings = tuple(dict.fromkeys((*self.config.candidates, _current(cache))))
            self._shadows = start_shadows(take_plus(cache), cache.system.name, settings)
            self._snapshot = None
        self._recorded = []
        self._counts = (cache.stats.hit_tokens, cache.stats.input_tokens)

    def _rate(self, cache: PrefixCache) -> float:
        hits, inputs = cache.stats.hit_tokens - self._counts[0], cache.stats.input_tokens - \
            self._counts[1]
        return hits / inputs if inputs else 0.0

    def _dropped(self, cache: PrefixCache) -> bool:
        """The open window's hit rate fell well below the last closed window's."""
        if not self._rates or len(self._recorded) < max(self.config.min_window,
                                                        self._window // 4):
            return False
        return self._rate(cache) < (1 - self.config.drop) * self._rates[-1]

    def _close(self, cache: PrefixCache) -> None:
        """Launch the replay of the recorded window; open the next one."""
        self._rates.append(self._rate(cache))
        before = _current(cache)
        candidates = tuple(dict.fromkeys((*self.config.candidates, before)))
        retune = Retune(at=cache.stats.commits, window=len(self._recorded), before=before,
                        chosen=before)
        self._pending = (retune, self._submit(cache, candidates))
        self._snapshot, self._recording = None, False
        if self.wait:
            self._adopt(cache)
        if self.config.periodic:
            self._open(cache)

    def _submit(self, cache: PrefixCache, candidates: tuple[Setting, ...]) -> list[Future[Any]]:
        """Shadow mode: one task advancing every shadow; else replays split over workers."""
        if self._shadows is not None:
            return [self._run(advance, self._shadows, self._recorded, self.config.objective)]
        assert self._snapshot is not None
        args = (self._snapshot, cache.system.name, self._recorded)
        if self.executor is None and self.wait:
            return [self._run(replay_settings, *args, candidates, self.config.objective)]
        executor = self.executor or self._own_pool()
        workers = _workers(executor)
        chunks = [candidates[i::workers] for i in range(workers)]
        return [executor.submit(replay_settings, *args, chunk, self.config.objective)
                for chunk in chunks if chunk]

    def _run(self, fn: Callable[..., T], *args: object) -> Future[T]:
        if self.executor is None and self.wait:
            future: Future[T] = Future()
            future.set_result(fn(*args))
            return future
        return (self.executor or self._own_pool()).submit(fn, *args)

    def _own_pool(self) -> Executor:
        self.executor = ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1))
        return self.executor

    def _adopt_if_ready(self, cache: PrefixCache) -> None:
        if self._pending is not None and all(f.done() for f in self._pending[1]):
            self._adopt(cache)

    def _adopt(self, cache: PrefixCache) -> None:
        """Collect the scores; switch only on a clear gain over the setting that ran."""
        assert self._pending is not None
        retune, futures = self._pending
        self._pending = None
        for future in futures:
            *moved, scores, seconds = future.result()
            if moved:  # shadows come back (copies, when they ran in another process)
                self._shadows = moved[0]
            retune.scores.update(scores)
            retune.seconds += seconds
        self.history.append(retune)
        decide = self._summed()
        if self._shadows is not None:
            for setting, score in retune.scores.items():
                self._totals[setting] = self._totals.get(setting, 0.0) + score
            decide = self._totals
        retune.chosen = guard(decide, retune.before, self.config.threshold)
        _setting(cache, retune.chosen)

    def _summed(self) -> dict[Setting, float]:
        """Replay scores summed over the last `horizon` windows (settings scored in all)."""
        recent = self.history[-self.config.horizon :] if self.config.horizon else self.history
        common = set(recent[0].scores).intersection(*(r.scores for r in recent[1:]))
        return {s: sum(r.scores[s] for r in recent) for s in common}


def guard(scores: dict[Setting, float], current: Setting, threshold: float) -> Setting:
    """The best-scoring setting if it beats `current` by more than `threshold` (relative);
    otherwise `current`. Ties among the best go to LRU, then the smallest alpha."""
    best = max(scores, key=lambda s: (scores[s], s.mode is Mode.LRU, -s.alpha))
    base = scores.get(current, 0.0)
    return best if scores[best] > base * (1 + threshold) and scores[best] > base else current


def _current(cache: PrefixCache) -> Setting:
    eviction = cache.eviction
    return eviction.setting if isinstance(eviction, Switchable) else Setting(Mode.FLOP,
                                                                             cache.alpha)


def _setting(cache: PrefixCache, setting: Setting) -> None:
    cache.set_alpha(setting.alpha)
    if isinstance(cache.eviction, Switchable):
        cache.eviction.set_setting(setting)


def _workers(executor: Executor) -> int:
    return getattr(executor, "_max_workers", None) or os.cpu_count() or 1


def replay_seconds(history: Sequence[Retune]) -> list[float]:
    """Replay wall time of each re-tune (for the overhead benchmark)."""
    return [r.seconds for r in history]


