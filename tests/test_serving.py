"""The serving replay (marconi.core.serving): what a server does with a trace."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from marconi.core.compiled import built
from marconi.core.serving import Mirror, Serving, Visibility, dependents, replay_serving
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig, simulate
from marconi.sim.latency import FlopsLatency
from marconi.systems import System, get_system
from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.types import Request
from tests.helpers import CACHES

KV = PAPER_7B.kv_bytes_per_token
SSM = PAPER_7B.ssm_bytes


def _apart(trace: Trace, gap: float = 1e7) -> Trace:
    """`trace` with every request stamped `gap` seconds after the one before: no two
    overlap, and a closed-loop turn issued after its previous one's finish plus the gap
    still comes in trace order."""
    requests = tuple(dataclasses.replace(r, arrival=i * gap)
                     for i, r in enumerate(trace.requests))
    return Trace(trace.name, requests, dict(trace.meta))


def _request(session: str, turn: int, arrival: float, tokens: list[int], n_output: int,
             output: int = 7) -> Request:
    return Request(session_id=session, turn=turn, arrival=arrival,
                   input_tokens=np.array(tokens, dtype=np.int32),
                   output_tokens=np.full(n_output, output, dtype=np.int32))


def _started_as_served(name: str) -> System:
    """The registered system whose tuner starts where the serving replay starts it (on
    its first-boundary expert, where it has one: marconi+, as `marconi serve` does)."""
    system = get_system(name)
    if system.tuner is None:
        return system
    factory = system.tuner
    return dataclasses.replace(system, tuner=lambda options: factory(
        dataclasses.replace(options, first_boundary=True)))


class TestOneAtATime:
    """With a batch of one, no two requests overlapping and no memory held by the
    running request, the serving replay is the sequential one, figure for figure, for
    every registered in-process system, its tuner started where the serving replay
    starts it. (Holding a running request's memory is what the sequential replay leaves
    out: with it, a contended cache evicts earlier.)"""

    @pytest.mark.parametrize("system", sorted(CACHES))
    @pytest.mark.parametrize("capacity", ["600MB", "3GB"])
    def test_equals_the_sequential_replay(self, system: str, capacity: str) -> None:
        trace = _apart(load_trace("synthetic:multi-turn", options=TraceOptions(sessions=6,
                                                                               seed=3)))
        base = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False)
        seq = simulate(trace, dataclasses.replace(base, replay="sequential"),
                       system=_started_as_served(system)).summary()
        srv = simulate(trace, dataclasses.replace(base, replay="serving", max_running=1,
                                                  hold_running=False)).summary()
        assert srv.replay == "serving" and seq.replay == "sequential"
        for key in ("hit_tokens", "flops_saved", "states_admitted", "evictions",
                    "refused_commits", "alpha"):
            assert getattr(srv, key) == getattr(seq, key), key
        assert srv.served is not None and srv.served.waited == 0

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm-2026", "marconi+"])
    def test_held_memory_alone_changes_nothing_where_nothing_is_evicted(
            self, system: str) -> None:
        trace = _apart(load_trace("synthetic:multi-turn", options=TraceOptions(sessions=6,
                                                                               seed=3)))
        base = SimConfig(spec=PAPER_7B, capacity="60GB", system=system, bounds=False)
        seq = simulate(trace, dataclasses.replace(base, replay="sequential"),
                       system=_started_as_served(system)).summary()
        srv = simulate(trace, dataclasses.replace(base, max_running=1)).summary()
        assert seq.evictions == srv.evictions == 0
        assert (srv.hit_tokens, srv.states_admitted) == (seq.hit_tokens, seq.states_admitted)

    @pytest.mark.skipif(not built(), reason="the compiled core is not built")
    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm-2026", "sglang-2026",
                                        "marconi+"])
    def test_both_cores_agree_under_load(self, system: str) -> None:
        """The serving replay with overlap, on the compiled core and on the Python core."""
        code = ("import json,sys;from marconi.core.spec import PAPER_7B;"
                "from marconi.sim import SimConfig, simulate;"
                "from marconi.workload import TraceOptions, load_trace;"
                "t=load_trace('synthetic:agent',options=TraceOptions(sessions=12,seed=1));"
                f"s=simulate(t,SimConfig(spec=PAPER_7B,capacity='3GB',system='{system}',"
                "bounds=False,max_running=4)).summary();"
                "print(json.dumps([s.hit_tokens,s.states_admitted,s.evictions,"
                "s.served.waited,s.served.makespan_s]))")
        out = {}
        for core in ("python", "compiled"):
            env = {**os.environ, "MARCONI_CORE": core}
            got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True)
            out[core] = got.stdout.strip()
        assert out["python"] == out["compiled"]
        assert int(out["python"].strip("[]").split(",")[3]) > 0  # requests did wait


class _Log:
    def __init__(self) -> None:
        self.hits: dict[int, int] = {}

    def __call__(self, i: int, request: Request, hit: int) -> None:
        self.hits[i] = hit


def _serve(system: str, requests: list[Request], *, capacity: str = "10GB",
           max_running: int = 8, chunk: int = 8192, decode_s: float = 0.01,
           visibility: Visibility | None = None) -> tuple[_Log, Any, Any]:
    s = get_system(system)
    cache = s.cache(PAPER_7B, capacity, alpha=0.0, layout=s.layout(PAPER_7B, capacity),
                    as_engine=True, replay=True)
    serving = Serving(max_running=max_running, chunk_tokens=chunk, decode_s=decode_s,
                      latency=FlopsLatency(PAPER_7B),
                      visibility=visibility or Visibility(s.visibility))
    log = _Log()
    stats = replay_serving(requests, cache, serving, log)
    return log, stats, cache


class TestTimeline:
    def test_a_request_is_looked_up_when_scheduled_not_when_it_arrives(self) -> None:
        """A second request (another session) that extends the first's whole sequence,
        arriving while the first runs: with room for both it misses (the first has not
        finished); with a batch of one it waits, is looked up after the first's commit,
        and hits its whole sequence."""
        first = _request("a", 0, 0.0, list(range(1, 1001)), 50)
        reqs = [first, _request("b", 0, 0.01, [*first.tokens().tolist(), 6000], 50)]
        both, stats, _ = _serve("sglang+", reqs, max_running=8)
        assert both.hits == {0: 0, 1: 0}
        assert stats.waited == 0 and stats.max_running == 2
        one, stats, _ = _serve("sglang+", reqs, max_running=1)
        assert one.hits[1] == 1050  # the first's input and output, its last state
        assert stats.waited == 1 and stats.max_running == 1
        assert stats.scheduled[1] == pytest.approx(stats.finished[0])

    def test_a_session_turn_is_issued_after_the_answer_plus_the_gap(self) -> None:
        """Closed loop: turn 2 extends turn 1's input and output, so it is issued at
        turn 1's finish plus the 3 s between their stamps, whatever its own stamp."""
        first = _request("s", 0, 0.0, list(range(1, 501)), 100)
        second = _request("s", 1, 3.0, [*range(1, 501), *[7] * 100, 900, 901], 10)
        other = _request("t", 0, 100.0, list(range(2000, 2100)), 10)
        assert dependents([first, second, other]) == [-1, 0, -1]
        log, stats, _ = _serve("marconi", [first, second, other], decode_s=0.05)
        # turn 1: prefill 500 tokens, then 99 decode steps of 0.05 s
        prefill = float(FlopsLatency(PAPER_7B).ttft(np.array([500]), np.array([0]))[0])
        assert stats.finished[0] == pytest.approx(prefill + 99 * 0.05)
        assert stats.issued[1] == pytest.approx(stats.finished[0] + 3.0)
        assert stats.issued[2] == pytest.approx(100.0)  # open loop: its own stamp
        assert log.hits[1] == 600  # the whole previous turn

    def test_a_turn_that_does_not_extend_the_last_is_open_loop(self) -> None:
        first = _request("s", 0, 0.0, list(range(1, 501)), 100)
        fresh = _request("s", 1, 3.0, list(range(1, 400)), 10)  # not first + its answer
        assert dependents([first, fresh]) == [-1, -1]

    def test_chunked_prefill_shares_the_step_budget(self) -> None:
        """A 2,500-token prompt at 1,000 tokens a step takes three steps, each timed by
        the latency model with the tokens already computed as its context."""
        big = _request("a", 0, 0.0, list(range(1, 2501)), 1)
        _, stats, _ = _serve("sglang+", [big], chunk=1000, decode_s=0.0)
        lat = FlopsLatency(PAPER_7B)
        steps = sum(float(lat.ttft(np.array([d + c]), np.array([d]))[0])
                    for d, c in ((0, 1000), (1000, 1000), (2000, 500)))
        assert stats.first_token[0] == pytest.approx(steps)
        assert stats.finished[0] == pytest.approx(steps)  # one output token: the first


class TestMemory:
    def test_running_requests_hold_memory_beside_the_cache(self) -> None:
        """A cache that holds one 10,000-token sequence, and two such requests running:
        the second waits for the first to finish (its footprint does not fit beside the
        first's), and the cache never holds more than its capacity with both counted."""
        cap = 10_500 * KV + 2 * SSM
        reqs = [_request("a", 0, 0.0, list(range(1, 10_001)), 10),
                _request("b", 0, 0.0, list(range(20_001, 30_001)), 10)]
        peak: list[int] = []
        s = get_system("sglang+")
        cache = s.cache(PAPER_7B, cap, replay=True, as_engine=True)
        serving = Serving(max_running=8, chunk_tokens=8192, decode_s=0.01,
                          latency=FlopsLatency(PAPER_7B))

        def record(i: int, request: Request, hit: int) -> None:
            kv, states = cache.reserved
            peak.append(cache.stats.bytes + kv + states * SSM)

        stats = replay_serving(reqs, cache, serving, record)
        assert stats.waited == 1
        assert stats.scheduled[1] == pytest.approx(stats.finished[0])
        assert max(peak) <= cap
        assert cache.reserved == (0, 0)

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm-2026", "sglang-2026",
                                        "marconi+", "vllm+"])
    def test_held_memory_never_exceeds_the_capacity(self, system: str) -> None:
        trace = load_trace("synthetic:agent", options=TraceOptions(sessions=10, seed=2))
        cap = 1_500_000_000
        s = get_system(system)
        cache = s.cache(PAPER_7B, cap, alpha=0.5, layout=s.layout(PAPER_7B, cap),
                        as_engine=True, replay=True)
        ssm = cache.spec.ssm_bytes
        over: list[int] = []

        def record(i: int, request: Request, hit: int) -> None:
            kv, states = cache.reserved
            held = cache.stats.bytes + kv + states * ssm
            if held > cache.capacity:
                over.append(held)

        stats = replay_serving(list(trace.requests), cache, Serving(
            max_running=16, chunk_tokens=2048, decode_s=0.02, latency=FlopsLatency(PAPER_7B),
            visibility=Visibility(s.visibility)), record)
        assert not over
        assert stats.max_running > 1
        assert cache.reserved == (0, 0)

    def test_reserve_refuses_what_pins_leave_no_room_for(self) -> None:
        s = get_system("sglang+")
        for core in (s.cache(PAPER_7B, 1000 * KV + SSM, replay=True),
                     s.cache(PAPER_7B, 1000 * KV + SSM)):
            core.commit(np.arange(1, 801, dtype=np.int32), 800)
            plan = core.lookup(np.arange(1, 802, dtype=np.int32))
            core.pin(plan.node)
            assert not core.reserve(300 * KV, 0)  # 800 pinned + 300 > 1000
            assert core.reserved == (0, 0) and core.stats.bytes == 800 * KV + SSM
            core.unpin(plan.node)
            assert core.reserve(300 * KV, 0)  # now the sequence may go
            assert core.stats.bytes == 0
            core.release(300 * KV, 0)
            with pytest.raises(ValueError):
                core.release(1, 0)


class TestVisibility:
    """Two requests sharing a 1,500-token prompt, the second arriving while the first
    prefills it in 1,000-token steps: it is scheduled in the second step, with the budget
    the first's last 501 tokens leave."""

    PROMPT = tuple(range(1, 1501))

    def _pair(self) -> list[Request]:
        return [_request("a", 0, 0.0, [*self.PROMPT, 5000], 20),
                _request("b", 0, 1e-6, [*self.PROMPT, 6000], 20)]

    def test_finish_shows_nothing_before_the_commit(self) -> None:
        log, _, _ = _serve("sglang+", self._pair(), chunk=1000, max_running=8)
        assert log.hits[1] == 0

    def test_sglang_shows_each_chunk_but_the_last(self) -> None:
        """SGLang: after each prefill chunk the request's tokens so far enter the tree
        with a state at the chunk's end, so the second request resumes from the first
        chunk's 1,000 tokens."""
        log, _, _ = _serve("sglang-2026", self._pair(), chunk=1000, max_running=8,
                               capacity="20GB")
        assert log.hits[1] == 1000

    def test_vllm_shows_blocks_as_they_fill(self) -> None:
        """vLLM: blocks become visible as they fill; the second request resumes from the
        last block boundary whose state the first kept of its first 1,000 tokens."""
        log, _, cache = _serve("vllm-2026", self._pair(), chunk=1000, max_running=8,
                               capacity="20GB")
        block = cache.admission.block
        assert 0 < log.hits[1] <= 1000 and log.hits[1] % block == 0

    @pytest.mark.parametrize(("system", "visibility", "hit"), [
        ("sglang+", None, 0), ("sglang+", "chunk", 1000), ("marconi", "chunk", 1000),
        ("marconi+", "chunk", 1000), ("sglang-2026", None, 1000),
        ("sglang-2026", "finish", 0)])
    def test_a_given_rule_replaces_the_engines(self, system: str, visibility: str | None,
                                               hit: int) -> None:
        """`--visibility`: the rule given, not the system's engine's, decides what the
        second request sees, through the simulator (and marconi's tuner and marconi+'s
        shadows, which are served with the same `Serving`)."""
        config = SimConfig(spec=PAPER_7B, capacity="20GB", system=system, bounds=False,
                           chunk_tokens=1000, max_running=8, visibility=visibility)
        result = simulate(Trace("pair", tuple(self._pair())), config)
        assert result.records.hit.tolist() == [0, hit]

    def test_a_rule_is_refused_outside_the_serving_replay(self) -> None:
        with pytest.raises(ValueError, match="visibility: 'chunk' is a rule of the serving"):
            SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", replay="sequential",
                      visibility="chunk")
        with pytest.raises(ValueError, match="visibility"):
            SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", visibility="blocks")
        done = subprocess.run([sys.executable, "-m", "marconi", "simulate",
                               "synthetic:multi-turn", "--capacity", "1GB", "--replay",
                               "sequential", "--visibility", "chunk"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "visibility: 'chunk' is a rule of the serving replay" in done.stderr


class TestLoops:
    """Which formats are closed loops (docs/architecture.md, "Replay protocols")."""

    @pytest.mark.parametrize(("name", "closed"), [
        ("synthetic:multi-turn", True), ("synthetic:agent", True),
        ("synthetic:branching", True), ("synthetic:rag", False),
        ("synthetic:system-prompt", False), ("sharegpt", True)])
    def test_a_later_turn_waits_for_the_answer_it_extends(self, name: str,
                                                          closed: bool) -> None:
        trace = load_trace(name, options=TraceOptions(sessions=5))
        after = dependents(trace.requests)
        later = [i for i, r in enumerate(trace.requests) if r.turn > 0]
        if closed:
            assert later and all(after[i] >= 0 for i in later)
            assert all(trace.requests[after[i]].session_id == trace.requests[i].session_id
                       for i in later)
        else:
            assert all(j < 0 for j in after)


class TestTunerWindow:
    """The bootstrap tuner of a served run replays its window served (overlapping, each
    request looked up when scheduled), not one request after another."""

    def test_an_overlapping_window_scores_what_a_server_would_hit(self) -> None:
        from marconi.core.snapshot import take
        from marconi.core.tuning import Objective
        from marconi.paper.tuner import Job, Policies, replay, replay_served

        system = get_system("marconi")
        cache = system.cache(PAPER_7B, "10GB", replay=True)
        first = np.arange(1, 2001, dtype=np.int32)
        whole = np.concatenate([first, np.full(50, 7, dtype=np.int32)])
        second = np.concatenate([whole, np.arange(5000, 5100, dtype=np.int32)])
        jobs = [Job(whole, 2000, (), "a", 0.0),
                Job(np.concatenate([second, [9]]).astype(np.int32), len(second), (), "b", 0.01)]
        policies = Policies(cache.admission, cache.eviction.fresh(0.0))
        serving = Serving(max_running=8, chunk_tokens=8192, decode_s=0.01,
                          latency=FlopsLatency(PAPER_7B))
        snap = take(cache)
        served = replay_served(snap, policies, jobs, [0.0], Objective.TOKENS, serving)
        in_turn = replay(snap, policies, [(j.all_tokens, j.n_input) for j in jobs], [0.0],
                         Objective.TOKENS)
        assert in_turn[0.0] == 2050  # one after another, the second resumes the first
        assert served[0.0] == 0  # served, the second is scheduled while the first runs
        one = Serving(max_running=1, chunk_tokens=8192, decode_s=0.01,
                      latency=FlopsLatency(PAPER_7B))
        assert replay_served(snap, policies, jobs, [0.0], Objective.TOKENS, one)[0.0] == 2050

    def test_a_served_run_tunes_on_served_windows(self, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
        import marconi.paper.tuner as tuner

        calls: list[str] = []
        real_served, real_replay = tuner.replay_served, tuner.replay
        monkeypatch.setattr(tuner, "_local_executor", lambda *args: tuner.Inline())
        monkeypatch.setattr(tuner, "replay_served",
                            lambda *a: (calls.append("served"), real_served(*a))[1])
        monkeypatch.setattr(tuner, "replay", lambda *a: (calls.append("turn"), real_replay(*a))[1])
        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=20, seed=1))
        for replay_, want in (("serving", "served"), ("sequential", "turn")):
            calls.clear()
            result = simulate(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system="marconi",
                                               bounds=False, replay=replay_))
            assert result.alpha_status == "tuned" and set(calls) == {want}


class TestServedShadows:
    """marconi+'s shadows are served on the live server's timeline: each looks a request
    up when the live server scheduled it, holds its memory while it runs and commits it
    when it finished, so the shadow of the expert that runs is the live cache itself."""

    @staticmethod
    def _run(capacity: str) -> tuple[Any, Any]:
        from marconi.core.tuning import Objective
        from marconi.plus.shadows import SGLANG_PLUS, Boundaries, Expert, ShadowConfig, ShadowTuner
        from marconi.plus.switchable import Mode

        trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12, seed=5))
        cache = get_system("marconi+").cache(PAPER_7B, capacity, replay=True)
        # the first expert (sglang+'s configuration) never leaves: no lead is enough
        tuner = ShadowTuner(ShadowConfig(
            experts=(SGLANG_PLUS, Expert(Boundaries.NONE, Mode.DENSITY)),
            objective=Objective.TOKENS, threshold=1e9, early_threshold=1e9,
            clear_lead=1.0, lead=1.0))
        serving = Serving(max_running=8, chunk_tokens=2048, decode_s=0.02,
                          latency=FlopsLatency(PAPER_7B))
        hits: dict[int, int] = {}
        stats = replay_serving(trace.requests, cache, serving,
                               lambda i, r, hit: hits.__setitem__(i, hit), tuner=tuner)
        return cache, (tuner, stats, hits)

    @pytest.mark.parametrize("capacity", ["2GB", "6GB"])
    def test_the_running_experts_shadow_saves_what_the_live_cache_saves(
            self, capacity: str) -> None:
        cache, (tuner, stats, hits) = self._run(capacity)
        assert stats.waited > 0 and tuner.switches == []  # requests overlapped
        assert tuner.totals[0] == sum(hits.values()) > 0
        # what the guard compares with that shadow: the live cache's kept lookups, not its
        # lookup counter (a request that did not fit yet was looked up again)
        assert tuner.live == tuner.totals[0] < cache.stats.hit_tokens


class TestRefusals:
    """What the serving replay cannot drive says so and names the way out."""

    def test_the_real_engines_own_code_refuses_it(self) -> None:
        from marconi.engines.real.envs import PeerError
        from marconi.sim.real_engine import replay

        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=2))
        system = get_system("vllm-0.32")
        with pytest.raises(PeerError, match="--replay sequential"):
            replay(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=system.name,
                                    bounds=False), system)

    @pytest.mark.parametrize("reference", ["offline", "reuse-oracle"])
    def test_the_references_of_the_sequential_replay_refuse_it(self, reference: str) -> None:
        from marconi.sim.run import run

        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=2))
        with pytest.raises(ValueError, match="--replay sequential"):
            run(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=reference))
        done = run(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=reference,
                                    replay="sequential"), warn=False)
        assert done.summary().replay == "sequential"

    def test_a_stream_is_refused_and_concurrent_needs_sequential(self) -> None:
        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=2))
        with pytest.raises(ValueError, match="whole trace"):
            simulate(iter(trace.requests), SimConfig(spec=PAPER_7B, capacity="1GB",
                                                     system="sglang+"))
        with pytest.raises(ValueError, match="--replay sequential --concurrent"):
            SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", concurrent=True)


class TestGivenTimeline:
    """`replay_timeline`: lookups, shows and commits at a served run's own times."""

    def test_a_lookup_sees_only_what_finished_before_it(self) -> None:
        from marconi.core.serving import replay_timeline

        a = _request("a", 0, 0.0, list(range(1, 1001)), 20)
        b = _request("b", 0, 0.0, [*a.tokens().tolist(), 7000, 7001], 5)
        hits = {}
        for b_at in (2.0, 5.0, 6.0):  # while A runs, as A finishes, after
            cache = get_system("sglang+").cache(PAPER_7B, "10GB", replay=True)
            log = _Log()
            replay_timeline([a, b], cache, np.array([0.0, b_at]), np.array([1.0, b_at + 1]),
                            np.array([5.0, b_at + 2]), log)
            hits[b_at] = log.hits[1]
            assert cache.reserved == (0, 0)
        assert hits == {2.0: 0, 5.0: 1020, 6.0: 1020}  # at 5.0 A's commit comes first

    def test_vllm_blocks_are_visible_once_prefilled(self) -> None:
        from marconi.core.serving import replay_timeline

        a = _request("a", 0, 0.0, list(range(1, 1001)), 20)
        b = _request("b", 0, 0.0, [*range(1, 1001), 7000], 5)
        got = {}
        for visibility in (Visibility.BLOCK, Visibility.FINISH):
            system = get_system("vllm-2026")
            cache = system.cache(PAPER_7B, "10GB", layout=system.layout(PAPER_7B, "10GB"),
                                 replay=True, as_engine=True)
            log = _Log()
            replay_timeline([a, b], cache, np.array([0.0, 2.0]), np.array([1.0, 3.0]),
                            np.array([5.0, 4.0]), log, visibility=visibility)
            got[visibility] = log.hits[1]
        block = cache.admission.block
        assert got[Visibility.FINISH] == 0
        assert got[Visibility.BLOCK] == (1000 - 1) // block * block > 0

    def test_times_out_of_order_are_refused(self) -> None:
        from marconi.core.serving import replay_timeline

        a = _request("a", 0, 0.0, list(range(1, 101)), 2)
        cache = get_system("sglang+").cache(PAPER_7B, "1GB", replay=True)
        with pytest.raises(ValueError, match=r"request 0 is scheduled at 2\.0"):
            replay_timeline([a], cache, np.array([2.0]), np.array([1.0]), np.array([3.0]),
                            _Log())


class TestServedCheck:
    """marconi.sim.served: a served run's records read back, its schedule reconstructed."""

    @staticmethod
    def _record(i: int, sent: float, first: float, done: float, **more: Any) -> dict:
        return {"index": i, "session": f"s{i}", "sent": sent, "first_token": first,
                "finished": done, "prompt": [1, 2, 3], "output": [4, 5],
                "cached_tokens": 0, "error": None} | more

    def test_the_server_schedules_first_come_first_served(self) -> None:
        from marconi.sim.served import read_served, scheduled

        records = [self._record(0, 0.0, 0.5, 4.0), self._record(1, 1.0, 1.2, 2.0),
                   self._record(2, 1.5, 4.5, 5.0), self._record(3, 3.0, 3.1, 3.5)]
        served = read_served(records)
        # two slots: request 2 waits for request 1's finish (2.0); request 3 would wait
        # for request 0's (4.0), but its first token came at 3.1, so it ran by then
        assert scheduled(served, 2).tolist() == [0.0, 1.0, 2.0, 3.1]
        assert scheduled(served, 8).tolist() == [0.0, 1.0, 1.5, 3.0]

    def test_a_record_without_its_timeline_is_named(self) -> None:
        from marconi.sim.served import read_served

        old = self._record(7, 0.0, 0.1, 0.2)
        del old["first_token"]
        with pytest.raises(ValueError, match=r"request 7.*first_token.*rerun bench_serve"):
            read_served([old])
        failed = self._record(8, 0.0, 0.1, 0.2, error="ConnectionError")
        assert read_served([failed]) == []

    def test_a_check_line_says_what_the_issue_asks(self) -> None:
        from marconi.sim.served import Check

        line = Check("vllm-0.32+marconi", "sharegpt(12)", "server timeline",
                     np.array([128, 0, 256]), np.array([128, 0, 128])).line()
        assert line == ("predict vllm-0.32+marconi on sharegpt(12) (server timeline): served "
                        "384 cached tokens, predicted 256 (ratio 0.67), requests with the "
                        "served hit 2/3")


def test_an_overloaded_server_is_said() -> None:
    from marconi.sim.summary import Served
    from marconi.sim.warnings import overload_warning
    from tests.helpers import make_summary

    def served(waited: int) -> Any:
        return make_summary(requests=100, served=Served(
            waited=waited, max_running=8, unreserved=0, makespan_s=10.0, ttft_p50=1.0,
            ttft_p95=4.0))

    message = overload_warning(served(51))
    assert message is not None and "51 of 100 requests waited" in message
    assert overload_warning(served(50)) is None
    assert overload_warning(make_summary(requests=100)) is None  # not served


class TestGuard:
    """marconi's re-tuning tuner is guarded by an alpha-0 twin of the live cache, fed the
    same requests as the live cache is (served on its timeline, or in turn)."""

    @pytest.mark.parametrize("replay", ["serving", "sequential"])
    def test_the_twin_saves_what_an_alpha_0_live_cache_saves(self, replay: str) -> None:
        from marconi.core.tuning import Objective
        from marconi.paper.tuner import Guard

        trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12, seed=5))
        cache = get_system("marconi").cache(PAPER_7B, "2GB", alpha=0.0, replay=True)
        guard = Guard(cache, Objective.TOKENS)
        guard.arm(True)
        hits: dict[int, int] = {}

        class Driver:  # what the tuner hands its guard
            def scheduled(self, cache: Any, i: int, request: Any, hit: int) -> None:
                guard.scheduled(i, request, hit)

            def shown(self, i: int, request: Any, n: int) -> None:
                guard.mirror.show(i, n)

            def finished(self, i: int, request: Any) -> None:
                guard.mirror.finish(i, request)

            def observe(self, cache: Any, tokens: Any, n_input: int, boundaries: Any = (),
                        session: Any = None, *, arrival: Any = None) -> None:
                assert not guard.observe(cache, tokens, n_input, boundaries)

        if replay == "serving":
            serving = Serving(max_running=8, chunk_tokens=2048, decode_s=0.02,
                              latency=FlopsLatency(PAPER_7B))
            stats = replay_serving(trace.requests, cache, serving,
                                   lambda i, r, hit: hits.__setitem__(i, hit), tuner=Driver())
            assert stats.waited > 0
        else:
            for i, r in enumerate(trace.requests):
                hits[i] = cache.lookup(r.input_tokens).hit
                cache.commit(r.tokens(), r.n_input)
                Driver().observe(cache, r.tokens(), r.n_input, r.boundaries)
        assert guard.books is not None
        assert guard.books[0] == guard.books[1] == sum(hits.values()) > 0

    def test_a_collapsing_alpha_is_replaced_by_alpha_0(self) -> None:
        """ShareGPT served at 3 GB: the windows adopt alpha 1.3, whose hits later collapse;
        the guard restores alpha 0, and re-tuning saves more than tuning once."""
        trace = load_trace("sharegpt", options=TraceOptions(min_turns=10))
        base = SimConfig(spec=PAPER_7B, capacity="3GB", system="marconi", bounds=False)
        guarded = simulate(trace, base).summary()
        once = simulate(trace, dataclasses.replace(base, retune=False)).summary()
        assert guarded.tuning is not None and guarded.tuning.report is not None
        assert guarded.tuning.report["restored"]
        assert guarded.flops_saved_rate > once.flops_saved_rate + 0.05


@pytest.mark.parametrize("core", ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    not built(), reason="the compiled core is not built"))])
# (a byte budget each: SGLang's emulation splits its capacity into a KV pool and state
# slots, which this arithmetic does not model)
@pytest.mark.parametrize("system", ["vllm-2026", "marconi"])
def test_a_show_does_not_hold_its_tokens_twice(core: str, system: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A running request's reservation holds its KV and its working state; when it shows
    its input, those leave the reservation before the commit takes the same tokens into
    the tree. Held by both at once they were counted twice, and the show evicted a state
    nobody needed evicted (the vLLM server kept it). At the room the request needs once
    shown, plus three states of slack (an engine's working states while it commits, its
    pool's rounding; the double count was the shown tokens' KV, here 2,000 tokens, and a
    state), an earlier request's state survives the show."""
    monkeypatch.setenv("MARCONI_CORE", core)
    chosen = get_system(system)
    first = Request(session_id="a", turn=0, arrival=0.0, output_tokens=np.arange(1, 9,
                    dtype=np.int32), input_tokens=np.arange(1, 1201, dtype=np.int32))
    running = Request(session_id="b", turn=0, arrival=0.0, output_tokens=np.arange(
        1, 9, dtype=np.int32), input_tokens=np.arange(5001, 7001, dtype=np.int32))

    def served(capacity: int) -> Any:
        options: dict[str, Any] = {"alpha": 0.0} if system == "marconi" else {}
        cache = chosen.cache(PAPER_7B, capacity, layout=chosen.layout(PAPER_7B, capacity),
                             as_engine=True, replay=True, **options)
        mirror = Mirror(cache)
        mirror.lookup(0, first)
        mirror.finish(0, first)
        mirror.lookup(1, running)
        mirror.show(1, 2000)
        return cache

    roomy = served(10**12)
    kv, states = roomy.reserved
    need = roomy.bytes + kv + (states + 3) * roomy.spec.ssm_bytes
    tight = served(need)
    assert tight.stats.evictions == 0
    extended = np.concatenate([first.tokens(), np.arange(9001, 9101, dtype=np.int32)])
    assert tight.peek(extended).hit == roomy.peek(extended).hit > 0
