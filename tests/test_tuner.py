from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.snapshot import take
from marconi.core.spec import PAPER_7B
from marconi.paper.admission import Judicious
from marconi.paper.eviction import FlopAware
from marconi.paper.tuner import GRID, BootstrapTuner, Objective, Policies
from marconi.sim import SimConfig, simulate
from marconi.systems import make_cache
from marconi.workload import TraceOptions, load_trace
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

    def test_a_retuning_window_is_capped_so_the_tuner_finishes(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        import marconi.paper.tuner as tuner_module

        monkeypatch.setattr(tuner_module, "MAX_WINDOW", 7)
        once = BootstrapTuner(executor=InlineExecutor(), wait=True)
        again = BootstrapTuner(executor=InlineExecutor(), wait=True, retune=True)
        _run(once, 120)
        _run(again, 120)
        assert once.result is not None and again.result is not None
        assert once.result.window == 5 * once.result.n0 > 7  # the paper's: not capped
        assert again.result.window == 7 and again.result.adopted[0][0] == again.result.n0 + 7

    def test_a_run_caps_its_windows_where_it_says(self) -> None:
        """`--retune-window N` reaches the simulated tuner; without it the cap is
        `MAX_WINDOW`; with `--no-retune` it is refused, not ignored."""
        import marconi.paper.tuner as tuner_module

        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=40, seed=2))
        windows = {}
        for cap in (None, 9):
            config = SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi", bounds=False,
                               retune_window=cap)
            tuning = simulate(trace, config).summary().tuning
            assert tuning is not None and "window" in tuning.report
            windows[cap] = (tuning.report["n0"], tuning.report["window"])
        (n0, capped), (_, default) = windows[9], windows[None]
        assert 5 * n0 > 9 and capped == 9
        assert default == min(5 * n0, tuner_module.MAX_WINDOW)
        with pytest.raises(ValueError, match="retune_window: 9 caps the windows"):
            SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi", retune=False,
                      retune_window=9)
        with pytest.raises(ValueError, match="at least one request"):
            BootstrapTuner(retune=True, max_window=0)


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
