"""The serving replay's loop in the compiled core (marconi.core.serving_native) against the
Python loop it stands for (marconi.core.serving._Server), on the same compiled cache:
every record, every time, every counter equal, bounds included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marconi.core import serving, serving_native
from marconi.core.compiled import built
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig
from marconi.sim import replay as sim_replay
from marconi.sim.bounds import UNBOUNDED, CompiledSeenTree, SeenTree, keep_all, seen_tree
from marconi.sim.latency import FlopsLatency
from marconi.systems import get_system
from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.types import Request
from tests.helpers import examples

pytestmark = pytest.mark.skipif(not built(), reason="the compiled core is not built")

# one per visibility rule and admission family: at finish (marconi's engine, an alpha
# given: no tuner), per chunk (SGLang's), per block (vLLM's), every block (vLLM+), none
# (vanilla), a declared order (LFU); admissions that hand positions per request (marconi+,
# its shadows told as the Python loop tells them; sparse prefix caching)
SYSTEMS = ["sglang+", "sglang-2026", "vllm-2026", "vllm+", "vanilla", "lfu", "marconi",
           "marconi+", "sparse-prefix"]


def _both(trace: Trace, config: SimConfig, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[object, object]:
    """The run with the Python loop, then with the compiled loop (which must have run)."""
    monkeypatch.setenv("MARCONI_CORE", "compiled")
    serve = sim_replay.serve_compiled
    ran: list[bool] = []
    with monkeypatch.context() as m:
        m.setattr(sim_replay, "serve_compiled", lambda *a, **k: None)
        python = sim_replay.simulate(trace, config)
    with monkeypatch.context() as m:
        m.setattr(sim_replay, "serve_compiled",
                  lambda *a, **k: (ran.append((out := serve(*a, **k)) is not None), out)[1])
        native = sim_replay.simulate(trace, config)
    assert ran == [True], "the compiled loop did not run"
    return python, native


def _same(python: object, native: object) -> None:
    a, b = python.summary().to_json(), native.summary().to_json()  # type: ignore[attr-defined]
    for summary in (a, b):
        summary.pop("seconds")
        if isinstance(summary.get("tuning"), dict):  # marconi+'s shadows time themselves
            summary["tuning"].pop("seconds", None)
    assert a == b
    for name, column in python.records.columns().items():  # type: ignore[attr-defined]
        assert np.array_equal(column, native.records.columns()[name]), name  # type: ignore[attr-defined]
    s, t = python.serving, native.serving  # type: ignore[attr-defined]
    for name in ("issued", "scheduled", "first_token", "finished"):
        assert np.array_equal(getattr(s, name), getattr(t, name), equal_nan=True), name
    assert (s.waited, s.max_running, s.unreserved, s.makespan) == \
        (t.waited, t.max_running, t.unreserved, t.makespan)
    assert python.bounds_dropped == native.bounds_dropped  # type: ignore[attr-defined]


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Sessions whose turns extend the previous turn's input and output (a closed loop)
    or start afresh, over a few shared system prompts and a small vocabulary (shared
    prefixes, splits), stamped close together (overlap) or with equal stamps."""
    prompts = [list(range(1 + 50 * k, 1 + 50 * k + draw(st.integers(20, 400))))
               for k in range(3)]
    requests: list[tuple[float, Request]] = []
    for s in range(draw(st.integers(1, 6))):
        history = list(prompts[draw(st.integers(0, 2))])
        ends = [len(history)]  # message boundaries: where each message ended
        t = draw(st.sampled_from([0.0, 0.5, float(s)]))
        for turn in range(draw(st.integers(1, 4))):
            if turn and draw(st.booleans()):
                history = list(prompts[draw(st.integers(0, 2))])  # not an extension
                ends = [len(history)]
            history += draw(st.lists(st.integers(1, 9), min_size=1, max_size=300))
            out = draw(st.lists(st.integers(1, 9), max_size=40))
            requests.append((t, Request(session_id=f"s{s}", turn=turn, arrival=t,
                                        input_tokens=np.array(history, dtype=np.int32),
                                        output_tokens=np.array(out, dtype=np.int32),
                                        boundaries=tuple(sorted(set(ends))))))
            ends.append(len(history))
            history += out
            ends.append(len(history))
            t += draw(st.sampled_from([0.0, 0.01, 0.3, 2.0]))
    requests.sort(key=lambda x: x[0])
    return Trace("drawn", tuple(r for _, r in requests))


@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(trace=traces(), system=st.sampled_from(SYSTEMS),
       capacity=st.sampled_from(["60MB", "150MB", "400MB", "4GB"]),
       max_running=st.integers(1, 5), chunk=st.sampled_from([64, 256, 8192]),
       decode=st.sampled_from([0.0, 0.004, 0.05]), hold=st.booleans(),
       bounds=st.sampled_from([False, True, 300]))
def test_the_compiled_loop_is_the_python_loop(
        trace: Trace, system: str, capacity: str, max_running: int, chunk: int, decode: float,
        hold: bool, bounds: bool | int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn traces and servers (a batch of one to five, steps of 64 tokens to 8K, no
    decode time or some, reservations or none, bounds kept or dropped past 300 tokens):
    the compiled loop's run equals the Python loop's, field for field."""
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, alpha=0.5
                       if system == "marconi" else None, max_running=max_running,
                       chunk_tokens=chunk, decode_s_per_token=decode, hold_running=hold,
                       bounds=bool(bounds),
                       **({"bounds_tokens": bounds} if bounds not in (True, False) else {}))
    _same(*_both(trace, config, monkeypatch))


@pytest.mark.parametrize("system", SYSTEMS)
def test_an_agent_trace_is_served_the_same(system: str, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """A queued server (8 running, 20 agents) with the default flags, bounds on."""
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=20, use_cache=False))
    # vLLM+'s state every 32 tokens: 2 GB holds no agent's request
    config = SimConfig(spec=PAPER_7B, capacity="20GB" if system == "vllm+" else "2GB",
                       system=system, max_running=8,
                       alpha=0.5 if system == "marconi" else None)
    python, native = _both(trace, config, monkeypatch)
    _same(python, native)
    assert python.serving.waited > 0  # it queued
    assert python.stats.evictions > 0 or system == "vanilla"  # the capacity binds


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(1, 3), max_size=14),
                          st.integers(0, 14)), max_size=40))
# a split's head keeps the longer input through it; a sequence ending inside an edge
# raises that edge's input length
@example([(True, [1, 2, 3, 4], 4), (True, [1, 2, 5], 0), (False, [1, 2], 0)])
@example([(True, [1, 2, 3, 4], 0), (True, [1, 2], 2), (False, [1, 2, 3], 0)])
def test_the_compiled_seen_tree_is_the_python_one(
        steps: list[tuple[bool, list[int], int]]) -> None:
    """Commits (with an input length inside or at the sequence's end) and lookups over a
    three-token vocabulary (splits inside edges, sequences ending mid-edge): the same
    (seen, from_inputs) and distinct-token counts from both trees."""
    python, native = SeenTree(), CompiledSeenTree()
    for commit, tokens, n_input in steps:
        array = np.array(tokens, dtype=np.int32)
        if commit:
            python.commit(array, min(n_input, len(tokens)))
            native.commit(array, min(n_input, len(tokens)))
        else:
            assert native.lookup(array) == python.lookup(array)
        assert native.tokens == python.tokens


def test_a_sequential_run_with_bounds_uses_the_compiled_tree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sequential replay's bounds on the compiled core: the compiled tree, the same
    records as the Python core's."""
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", replay="sequential")
    runs = {}
    for core in ("python", "compiled"):
        monkeypatch.setenv("MARCONI_CORE", core)
        runs[core] = sim_replay.simulate(trace, config).records.columns()
        assert isinstance(seen_tree(get_system("sglang+").cache(
            PAPER_7B, UNBOUNDED, evict_with=keep_all, replay=True)),
            CompiledSeenTree if core == "compiled" else SeenTree)
    for name, column in runs["python"].items():
        assert np.array_equal(column, runs["compiled"][name]), name
    assert runs["compiled"]["seen"].sum() > 0


def test_a_tuned_run_is_served_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """marconi's bootstrap tuner (re-tuning, its guard twin served), told by the compiled
    loop at the Python loop's places: the same run, the tuning's report included."""
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=40, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity="3GB", system="marconi", max_running=8)
    python, native = _both(trace, config, monkeypatch)
    _same(python, native)
    assert python.alpha_status == "tuned" and python.tuning.adopted  # it tuned


def test_every_callback_is_told_in_the_python_loops_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay_serving`'s record and commit callbacks, by both loops: the same calls, in
    the same order, with the cache's bytes at each."""
    monkeypatch.setenv("MARCONI_CORE", "compiled")
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=10, use_cache=False))
    system = get_system("vllm-2026")  # visible per step: commits while running
    calls = {name: _calls(replay, list(trace.requests), system)
             for name, replay in (("python", serving.replay_serving),
                                  ("compiled", serving_native.replay_serving))}
    assert calls["compiled"] == calls["python"]
    assert any(c[0] == "commit" and not c[3] for c in calls["python"])  # shown while running


def test_a_callbacks_error_stops_the_loop_and_is_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARCONI_CORE", "compiled")
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=3, use_cache=False))
    system = get_system("sglang+")
    cache = system.cache(PAPER_7B, "1GB", as_engine=True, replay=True)
    seen: list[int] = []

    def record(i: int, request: object, hit: int) -> None:
        seen.append(i)
        if len(seen) == 5:
            raise KeyError("the fifth")

    with pytest.raises(KeyError, match="the fifth"):
        serving_native.replay_serving(list(trace.requests), cache, _server(system), record)
    assert len(seen) == 5  # stopped there


def _calls(replay: Any, requests: list[Request], system: Any) -> list[tuple[object, ...]]:
    """Each record and commit callback `replay` made, with the cache's KV bytes then."""
    cache = system.cache(PAPER_7B, "1GB", layout=system.layout(PAPER_7B, "1GB"),
                         as_engine=True, replay=True)
    log: list[tuple[object, ...]] = []

    def record(i: int, request: object, hit: int) -> None:
        log.append(("record", i, hit, cache.stats.kv_bytes))

    def commit(i: int, request: object, n: int, done: bool) -> None:
        log.append(("commit", i, n, done, cache.stats.kv_bytes))

    replay(requests, cache, _server(system), record, on_commit=commit)
    return log


@pytest.mark.parametrize(("system", "visibility"), [
    ("marconi+", serving.Visibility.BLOCK), ("marconi+", serving.Visibility.CHUNK),
    ("sparse-prefix", serving.Visibility.BLOCK)])
def test_an_admission_is_asked_for_positions_at_each_call(
        system: str, visibility: serving.Visibility, monkeypatch: pytest.MonkeyPatch) -> None:
    """An admission that hands the core positions per request is asked for them by the
    compiled loop with what the Python loop gives it before each lookup, show and commit
    (the tokens, input length, boundaries and phase), in its order, and the runs agree."""
    monkeypatch.setenv("MARCONI_CORE", "compiled")
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=10, use_cache=False))
    assert any(r.boundaries for r in trace.requests)
    chosen = get_system(system)
    runs = {}
    for name, replay in (("python", serving.replay_serving),
                         ("compiled", serving_native.replay_serving)):
        cache = chosen.cache(PAPER_7B, "1GB", layout=chosen.layout(PAPER_7B, "1GB"),
                             as_engine=True, replay=True)
        assert cache._structured  # type: ignore[attr-defined]
        asked: list[tuple[object, ...]] = []
        ask = cache.admission.extra_positions  # type: ignore[attr-defined]

        def logged(key: bytes, n: int, at: Any, phase: str = "lookup", ask: Any = ask,
                   asked: list[tuple[object, ...]] = asked) -> Any:
            asked.append((len(key), hash(key), n, tuple(at), phase))
            return ask(key, n, at, phase)

        cache.admission.extra_positions = logged  # type: ignore[attr-defined]
        hits: list[tuple[int, int]] = []
        server = serving.Serving(max_running=4, chunk_tokens=512, decode_s=0.01,
                                 latency=FlopsLatency(PAPER_7B), visibility=visibility)
        replay(list(trace.requests), cache, server,
               lambda i, r, hit, hits=hits: hits.append((i, hit)))
        runs[name] = (asked, hits)
    assert runs["compiled"] == runs["python"]
    # commits while running (shows) besides one at each finish
    assert sum(a[4] == "commit" for a in runs["python"][0]) > len(trace.requests)


def _server(system: object) -> serving.Serving:
    return serving.Serving(max_running=4, chunk_tokens=2048, decode_s=0.01,
                           latency=FlopsLatency(PAPER_7B),
                           visibility=serving.Visibility(system.visibility))  # type: ignore[attr-defined]


class _Stop(Exception):
    pass


def test_a_signal_stops_the_compiled_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal whose handler raises (Ctrl-C's KeyboardInterrupt, here a timer's) stops a
    long compiled loop midway and is raised, as it stops the Python loop."""
    import signal
    import time

    monkeypatch.setenv("MARCONI_CORE", "compiled")
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=400, use_cache=False))
    system = get_system("sglang+")

    def run() -> tuple[float, object]:
        cache = system.cache(PAPER_7B, "20GB", as_engine=True, replay=True)
        start = time.perf_counter()
        serving_native.serve_compiled(list(trace.requests), cache, _server(system))
        return time.perf_counter() - start, cache

    whole, _ = run()

    def stop(*_: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, whole / 2)
        cache = system.cache(PAPER_7B, "20GB", as_engine=True, replay=True)
        with pytest.raises(_Stop):
            serving_native.serve_compiled(list(trace.requests), cache, _server(system))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert 0 < cache.stats.lookups < len(trace)  # stopped inside the loop, midway


def test_the_tuners_served_replays_run_on_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap tuner's served window replays on the compiled core run on threads
    (their loop releases the GIL), and find what they find on the calling thread."""
    from concurrent.futures import ThreadPoolExecutor

    from marconi.paper import tuner

    pool = tuner._local_executor(4, wait=True, window=tuner.INLINE_WINDOW, threads=True)
    assert isinstance(pool, ThreadPoolExecutor)
    pool.shutdown()
    monkeypatch.setenv("MARCONI_CORE", "compiled")
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=60, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity="3GB", system="marconi", max_running=8)
    made: list[object] = []
    local = tuner._local_executor
    monkeypatch.setattr(tuner, "_local_executor",
                        lambda *a, **k: (made.append(out := local(*a, **k)), out)[1])
    threaded = sim_replay.simulate(trace, config).summary().to_json()
    assert any(isinstance(e, ThreadPoolExecutor) for e in made)
    monkeypatch.setattr(tuner, "_local_executor", lambda *a, **k: tuner.Inline())
    inline = sim_replay.simulate(trace, config).summary().to_json()
    for run in (threaded, inline):
        run.pop("seconds")
        run["tuning"].pop("seconds", None)
    assert threaded == inline and threaded["alpha_status"] == "tuned"
