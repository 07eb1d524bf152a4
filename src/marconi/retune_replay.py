"""Snapshots and replays of a `marconi+` cache, for `marconi.retuner` (picklable).

A `Switchable` eviction keeps two sets of stamps (FLOP-aware: hit nodes only; LRU: whole
paths), so its snapshot carries both, and a replay restores both before switching to
the candidate setting.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marconi.cache import PrefixCache
from marconi.policies.plus import Setting, Switchable
from marconi.snapshot import Snapshot, rebuild, take
from marconi.tuner import Objective

Window = tuple[np.ndarray, int, tuple[int, ...]]  # input + output, input length, boundaries


@dataclass(frozen=True, slots=True)
class PlusSnapshot:
    base: Snapshot  # structure, states, FLOP-aware stamps
    lru_stamps: tuple[float, ...]  # the LRU twin's stamps, in `base`'s node order


def take_plus(cache: PrefixCache) -> PlusSnapshot:
    """Copy `cache`'s tree and both stamp sets (a full walk, once per window)."""
    base = take(cache)
    eviction = cache.eviction
    stamps = eviction.lru.stamp if isinstance(eviction, Switchable) else eviction.stamp
    return PlusSnapshot(base, tuple(stamps.get(node, 0) for node in cache.tree.nodes()))


def restore_plus(snapshot: PlusSnapshot, system: str, setting: Setting) -> PrefixCache:
    """A fresh cache of `system` holding the snapshot, running `setting` (no tuner)."""
    snap = snapshot.base
    cache = PrefixCache(snap.spec, snap.capacity, system, alpha=setting.alpha, tuner=None)
    nodes = rebuild(snap, cache)
    if isinstance(cache.eviction, Switchable):
        cache.eviction.lru.restore(dict(zip(nodes, snapshot.lru_stamps, strict=True)))
        cache.eviction.set_setting(setting)
    return cache


def replay_settings(snapshot: PlusSnapshot, system: str, requests: Sequence[Window],
                    settings: Sequence[Setting], objective: Objective
                    ) -> tuple[dict[Setting, float], float]:
    """Objective reached by each setting on `requests` from `snapshot`, and the seconds
    the replays took."""
    start = time.perf_counter()
    out = {}
    for setting in settings:
        cache = restore_plus(snapshot, system, setting)
        total = 0.0
        for tokens, n_input, boundaries in requests:
            hit = cache.lookup(tokens[:n_input], boundaries=boundaries).hit
            total += snapshot.base.spec.flops(hit) if objective is Objective.FLOPS else hit
            cache.commit(tokens, n_input, boundaries=boundaries)
        out[setting] = total
    return out, time.perf_counter() - start


Shadows = dict[Setting, PrefixCache]


def start_shadows(snapshot: PlusSnapshot, system: str, settings: Sequence[Setting]) -> Shadows:
    """One metadata-only cache per setting, all starting from `snapshot`."""
    return {s: restore_plus(snapshot, system, s) for s in settings}


def advance(shadows: Shadows, requests: Sequence[Window], objective: Objective
            ) -> tuple[Shadows, dict[Setting, float], float]:
    """Run `requests` through every shadow cache (they keep their state across windows);
    returns the shadows, each one's objective on this window, and the seconds taken."""
    start = time.perf_counter()
    scores = {}
    for setting, cache in shadows.items():
        total = 0.0
        for tokens, n_input, boundaries in requests:
            hit = cache.lookup(tokens[:n_input], boundaries=boundaries).hit
            total += cache.spec.flops(hit) if objective is Objective.FLOPS else hit
            cache.commit(tokens, n_input, boundaries=boundaries)
        scores[setting] = total
    return shadows, scores, time.perf_counter() - start
