from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.snapshot import take
from marconi.paper.admission import Judicious
from marconi.paper.eviction import FlopAware
from marconi.paper.tuner import GRID, BootstrapTuner, Objective, Policies
from marconi.systems import make_cache
from tests.helpers import SMALL, serve


def _workload(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Long conversations and short one-off requests competing for a small cache."""
    rng = np.random.default_rng(seed)
    history: dict[int, list[int]] = {}
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            sid = int(rng.integers(0, 4))
            inp = history.get(sid, [10_000 * (sid + 1)]) + rng.integers(0, 50, 40).tolist()
            reply = rng.integers(0, 50, 10).tolist()
            history[sid] = inp + reply
        else:
            inp, reply = rng.integers(100, 200, 15).tolist(), [1]
        out.append((inp, reply))
    return out


def _run(tuner: BootstrapTuner, n: int = 120) -> PrefixCache:
    cache = make_cache(SMALL, 700_000, "marconi")
    for inp, reply in _workload(n):
        serve(cache, tuner, inp + reply, len(inp))
    return cache


class InlineExecutor(Executor):
    """Runs each task at submit: a deterministic stand-in for a remote cluster's timing."""

    _max_workers = 2

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class TestBootstrap:
    def test_tunes_after_first_eviction(self) -> None:
        tuner = BootstrapTuner(executor=ThreadPoolExecutor(2), wait=True)
        cache = _run(tuner)
        assert tuner.done and tuner.result is not None
        assert tuner.result.window == 5 * tuner.result.n0 > 0
        assert set(tuner.result.scores) == set(GRID)
        best = max(tuner.result.scores.values())
        assert tuner.result.scores[tuner.result.alpha] == best
        assert cache.alpha == tuner.result.alpha

    def test_retune_tunes_each_following_window(self) -> None:
        """`retune`: after each adoption a new window of the same length is recorded from
        a snapshot taken then, replayed and adopted; its first window is the paper's."""
        once = BootstrapTuner(executor=InlineExecutor(), wait=True)
        again = BootstrapTuner(executor=InlineExecutor(), wait=True, retune=True)
        _run(once, 400)
        cache = _run(again, 400)
        assert once.result is not None and again.result is not None
        first, window = once.result.adopted[0], once.result.window
        assert len(once.result.adopted) == 1 and once.done
        adopted = again.result.adopted
        assert adopted[0] == first and len(adopted) >= 3 and not again.done and again.tuned
        # each next window: the snapshot at the adoption's observe, then `window` more
        assert all(b[0] - a[0] == window + 1 for a, b in itertools.pairwise(adopted))
        assert cache.alpha == adopted[-1][1]
        scores = again.result.scores
        assert scores[again.result.alpha] == max(scores.values())

    def test_local_processes_when_waiting_and_deterministic(self) -> None:
        first, second = BootstrapTuner(wait=True), BootstrapTuner(wait=True)
        _run(first)
        _run(second)
        assert first.result is not None and second.result is not None
        assert first.result.scores == second.result.scores

    def test_alpha_zero_until_tuned(self) -> None:
        tuner = BootstrapTuner(multiplier=1000)
        cache = _run(tuner, 60)
        assert not tuner.done and cache.alpha == 0.0

    def test_without_waiting_adopts_on_a_later_commit(self) -> None:
        tuner = BootstrapTuner(executor=InlineExecutor(), wait=False)
        cache = make_cache(SMALL, 700_000, "marconi")
        launched_at = None
        for i, (inp, reply) in enumerate(_workload(120)):
            serve(cache, tuner, inp + reply, len(inp))
            if launched_at is None and tuner._futures:
                launched_at = i
                assert cache.alpha == 0.0  # results are ready, but not adopted mid-commit
        assert launched_at is not None and tuner.done and tuner.result is not None
        assert cache.alpha == tuner.result.alpha

    def test_token_objective(self) -> None:
        tuner = BootstrapTuner(executor=ThreadPoolExecutor(1), objective="tokens", wait=True)
        _run(tuner)
        assert tuner.objective is Objective.TOKENS and tuner.result is not None
        assert all(float(s).is_integer() for s in tuner.result.scores.values())

    def test_replay_equals_live_run_for_same_alpha(self) -> None:
        """A replay from a snapshot reproduces what the live cache does."""
        live = make_cache(SMALL, 700_000, "marconi", alpha=0.7)
        work = _workload(80)
        for inp, reply in work[:40]:
            live.lookup(inp)
            live.commit(inp + reply, len(inp))
        copy = Policies(Judicious(), FlopAware(SMALL)).cache(take(live), 0.7)
        for inp, reply in work[40:]:
            assert live.lookup(inp).hit == copy.lookup(inp).hit
            live.commit(inp + reply, len(inp))
            copy.commit(inp + reply, len(inp))
        assert live.bytes == copy.bytes


@pytest.mark.parametrize("kwargs,word", [
    ({"grid": []}, "grid"), ({"grid": [-1.0]}, "grid"), ({"multiplier": 0}, "multiplier"),
    ({"objective": "latency"}, "latency")])
def test_bad_settings(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        BootstrapTuner(**kwargs)


def test_the_cache_never_calls_a_tuner() -> None:
    """Tuning is the driver's: commits alone leave alpha where it was."""
    cache = make_cache(SMALL, 700_000, "marconi")
    for inp, reply in _workload(120):
        cache.lookup(inp)
        cache.commit(inp + reply, len(inp))
    assert cache.stats.evictions > 0 and cache.alpha == 0.0
