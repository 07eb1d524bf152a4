"""The library's default tuner never blocks a commit (docs/embedding.md, "Tuning")."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from marconi.paper.tuner import BootstrapTuner, Inline, _local_executor
from marconi.systems import TunerOptions, get_system, make_cache
from tests.helpers import SMALL, serve
from tests.test_tuner import _workload


def _until_launch(tuner: BootstrapTuner):
    """Serve requests until the tuner launches its replays; returns the cache and the
    requests left."""
    cache = make_cache(SMALL, 700_000, "marconi")
    work = _workload(200)
    for i, (inp, reply) in enumerate(work):
        serve(cache, tuner, inp + reply, len(inp))
        if tuner._futures or tuner.tuned:
            return cache, work[i + 1 :]
    raise AssertionError("the tuner never launched")


def test_the_default_tuner_is_the_non_blocking_one():
    tuner = get_system("marconi").make_tuner()
    assert isinstance(tuner, BootstrapTuner)
    assert (tuner.wait, tuner.executor) == (False, None)


def test_a_commit_returns_while_the_replays_wait_behind_a_busy_executor():
    """The replays queue behind a task holding the executor's only worker; the launching
    commit returns at once, and a later one adopts the result once it is there."""
    gate, pool = threading.Event(), ThreadPoolExecutor(1)
    pool.submit(gate.wait, 30)
    release = threading.Timer(10, gate.set)  # a tuner that blocked would wait for this
    release.start()
    tuner = get_system("marconi").make_tuner(options=TunerOptions(executor=pool))
    cache, rest = _until_launch(tuner)
    # a blocking tuner would have waited for the gate (set only by the timer) to launch
    assert not gate.is_set() and not any(f.done() for f in tuner._futures)
    gate.set()
    for f in tuner._futures:
        f.result(timeout=60)
    for inp, reply in rest[:1]:
        serve(cache, tuner, inp + reply, len(inp))
    assert tuner.tuned and tuner.result is not None and cache.alpha == tuner.result.alpha
    release.cancel()


def test_a_background_replay_scores_what_a_blocking_one_does():
    background, blocking = BootstrapTuner(), BootstrapTuner(executor=ThreadPoolExecutor(2),
                                                          wait=True)
    cache, rest = _until_launch(background)
    for f in background._futures:
        f.result(timeout=60)
    serve(cache, background, rest[0][0] + rest[0][1], len(rest[0][0]))
    _until_launch(blocking)
    assert background.result is not None and blocking.result is not None
    assert background.result.scores == blocking.result.scores


def test_no_fork_from_a_process_holding_torch():
    """Once torch is loaded a waiting tuner replays on the calling thread (a fork may hang;
    a forkserver's state breaks in a sweep's forked workers), with the same scores."""
    pytest.importorskip("torch")
    assert "torch" in sys.modules
    assert isinstance(_local_executor(4, wait=True), Inline)
    inline, threads = BootstrapTuner(wait=True), BootstrapTuner(
        executor=ThreadPoolExecutor(2), wait=True)
    _until_launch(inline)
    _until_launch(threads)
    assert inline.result is not None and threads.result is not None
    assert inline.result.scores == threads.result.scores


def test_a_short_window_replays_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes cost more to start than a short window's replays (a re-tuning tuner on a
    small cache launches hundreds of them): below `INLINE_WINDOW` requests, inline."""
    import marconi.paper.tuner as tuner

    monkeypatch.delitem(sys.modules, "torch", raising=False)  # processes otherwise
    assert isinstance(_local_executor(4, wait=True, window=tuner.INLINE_WINDOW - 1), Inline)
    pool = _local_executor(4, wait=True, window=tuner.INLINE_WINDOW)
    assert not isinstance(pool, Inline)
    pool.shutdown()


@pytest.mark.parametrize("name", ["sglang-2026+marconi", "vllm-2026+marconi"])
def test_the_plugins_emulations_tune_once_as_the_plugins_do(name: str) -> None:
    """What the engine plugins install tunes once (their chooser asks for it); marconi
    itself re-tunes by default."""
    emulated = get_system(name).make_tuner(options=TunerOptions(wait=True))
    ours = get_system("marconi").make_tuner(options=TunerOptions(wait=True))
    assert isinstance(emulated, BootstrapTuner) and isinstance(ours, BootstrapTuner)
    assert not emulated.retune and ours.retune
