"""marconi+: GreedyDual-FLOP eviction and the shadow experts that steer it (hit density
has its own tests: test_density.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.compiled import CORE_ENV, CORES, built
from marconi.core.integrity import check_integrity
from marconi.core.snapshot import Snapshot, take
from marconi.core.spec import PAPER_7B
from marconi.plus.admission import Structured
from marconi.plus.greedy_dual import GreedyDualFlop
from marconi.plus.shadows import (
    ATTENTION_ONLY,
    DEFAULT_EXPERTS,
    HEDGE,
    SGLANG_PLUS,
    Boundaries,
    Expert,
    ShadowConfig,
    ShadowReport,
    ShadowTuner,
    apply,
    leader,
)
from marconi.plus.switchable import Mode, Switchable
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.sim.warnings import run_warnings
from marconi.systems import TunerOptions, get_system, make_cache
from marconi.workload import TraceOptions, load_trace
from tests.helpers import SMALL, serve


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _request(cache: PrefixCache, inp: list[int], boundaries: tuple[int, ...] = (),
             tuner: ShadowTuner | None = None) -> int:
    return serve(cache, tuner, [*inp, 1], len(inp), boundaries)


class TestGreedyDual:
    def _cache(self, capacity: int) -> PrefixCache:
        cache = make_cache(SMALL, capacity, "marconi+-gd")
        assert isinstance(cache.eviction, Switchable)
        assert isinstance(cache.eviction.flop, GreedyDualFlop)
        return cache

    def test_keeps_the_long_sequence_lru_drops(self) -> None:
        long_bytes = 1000 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        short_bytes = 11 * SMALL.kv_bytes_per_token + SMALL.ssm_bytes
        cache = self._cache(long_bytes + 2 * short_bytes + 40_000)
        for start, n in ((0, 1000), (10_000, 10), (20_000, 10), (30_000, 10)):
            _request(cache, _seq(start, n))
        assert cache.lookup([*_seq(0, 1000), 1, 5]).hit == 1001  # its end state survived
        assert cache.lookup([*_seq(10_000, 10), 1, 5]).hit == 0  # the oldest short one left
        check_integrity(cache)

    def test_stale_entries_age_out(self) -> None:
        """The level rises with every victim, so an efficient entry never touched again
        leaves eventually (FLOP-aware with a large alpha would keep it for ever)."""
        cache = self._cache(1000 * SMALL.kv_bytes_per_token + 3 * SMALL.ssm_bytes)
        _request(cache, _seq(0, 900))
        for i in range(200):
            _request(cache, _seq(100_000 * (i + 1), 50))
        assert cache.lookup([*_seq(0, 900), 1]).hit == 0
        policy = cache.eviction
        assert isinstance(policy, Switchable) and isinstance(policy.flop, GreedyDualFlop)
        assert policy.flop.level > 0

    def test_scale_free(self) -> None:
        """Multiplying every efficiency by a constant changes no decision."""
        rng = np.random.default_rng(0)
        work = [rng.integers(0, 30, int(rng.integers(20, 300))).tolist() for _ in range(80)]
        hits = []
        for scale in (1, 1000):
            cache = self._cache(400_000)
            assert isinstance(cache.eviction, Switchable)
            policy = cache.eviction.flop
            base = policy.efficiency
            policy.efficiency = lambda node, base=base, k=scale: k * base(node)  # type: ignore[method-assign]
            hits.append([_request(cache, inp) for inp in work])
        assert hits[0] == hits[1] and sum(hits[0]) > 0


class TestShadowTuner:
    def _twice(self) -> list[tuple[list[int], tuple[int, ...]]]:
        """Prefixes each used by exactly two requests: only a boundary checkpoint (taken
        on the first use) can hit; Marconi's admission checkpoints on the second."""
        out = []
        for i in range(40):
            prefix = _seq(1000 * (i + 1), 200)
            for j in range(2):
                out.append(([*prefix, 7 + j, *_seq(50, 30)], (200,)))
        return out

    def test_switches_to_the_expert_that_hits(self) -> None:
        tuner = ShadowTuner(ShadowConfig(every=4))
        cache = make_cache(SMALL, "1GB", "marconi+")
        hits = [_request(cache, inp, b, tuner) for inp, b in self._twice()]
        assert tuner.expert.boundaries is not Boundaries.NONE
        assert tuner.switches and hits[-1] == 200  # the live cache now hits the 2nd use
        assert tuner.seen == len(hits) and tuner.totals.max() > 0
        check_integrity(cache)
        for shadow in tuner.shadows:
            check_integrity(shadow)

    def test_threshold_keeps_the_running_expert(self) -> None:
        tuner = ShadowTuner(ShadowConfig(every=1, threshold=0.01, warmup=0))
        cache = make_cache(SMALL, "1GB", "marconi+")
        _request(cache, _seq(0, 10), tuner=tuner)  # starts the shadows
        tuner.totals[:] = 100.0
        tuner.totals[3] = 100.5  # leads by 0.5%: not enough
        tuner._decide(cache)
        assert not tuner.switches and tuner.expert == DEFAULT_EXPERTS[0]
        tuner.totals[3] = 102.0  # leads by 2%
        tuner._decide(cache)
        assert tuner.expert == DEFAULT_EXPERTS[3] and len(tuner.switches) == 1

    def test_report(self) -> None:
        tuner = ShadowTuner(ShadowConfig(every=2))
        cache = make_cache(SMALL, "1GB", "marconi+")
        for inp, b in self._twice()[:10]:
            _request(cache, inp, b, tuner=tuner)
        report = tuner.report()
        assert report.requests == 10
        assert list(report.totals) == list(DEFAULT_EXPERTS)
        assert report.to_json()["requests"] == 10

    def test_attention_only_runs_the_block_cache(self) -> None:
        """No SSM layer: a node every 32 tokens, LRU tail first, no shadows to feed."""
        spec = dataclasses.replace(SMALL, ssm_layers=0)
        tuner = ShadowTuner()
        cache = make_cache(spec, "1GB", "marconi+")
        _request(cache, _seq(0, 100), tuner=tuner)
        assert tuner.experts == ATTENTION_ONLY and not tuner.shadows
        assert cache.eviction.mode is Mode.LRU  # type: ignore[attr-defined]
        depths = sorted(n.depth for n in cache.tree.nodes() if n is not cache.tree.root)
        assert depths[:3] == [32, 64, 96]
        assert cache.lookup([*_seq(0, 70), 5]).hit == 70  # attention reuses any prefix
        check_integrity(cache)

    def test_apply_needs_a_marconi_plus_cache(self) -> None:
        with pytest.raises(ValueError, match="cannot run shadow experts"):
            apply(make_cache(SMALL, "1GB", "sglang+"), Expert(Boundaries.LAST, Mode.LRU))

    def test_depth_expert_needs_the_depth_twin(self) -> None:
        """Systems that never run the depth-classed expert keep no twin for it (less
        work per event); asking one to run it is an error, not a silent fallback."""
        cache = make_cache(SMALL, "1GB", "marconi+-no-depth")
        assert cache.eviction.depth is None  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="no depth-classed expert"):
            apply(cache, Expert(Boundaries.NONE, Mode.DEPTH))
        full = make_cache(SMALL, "1GB", "marconi+")
        apply(full, Expert(Boundaries.NONE, Mode.DEPTH))
        assert full.eviction.mode is Mode.DEPTH  # type: ignore[attr-defined]

    def test_warmup_needs_a_decisive_lead(self) -> None:
        """In the warm-up the leader needs `early_threshold` (marconi+: the same 5% as
        after it, not the 1% asked here after the warm-up)."""
        tuner = ShadowTuner(ShadowConfig(every=1, warmup=1000, threshold=0.01))
        assert tuner.config.early_threshold == 0.05
        cache = make_cache(SMALL, "1GB", "marconi+")
        _request(cache, _seq(0, 10), tuner=tuner)  # starts the shadows
        tuner.totals[:] = 100.0
        tuner.totals[3] = 104.0  # leads by 4%: not enough during the warm-up
        tuner._decide(cache)
        assert not tuner.switches
        tuner.totals[3] = 106.0  # saves 6% more: followed at once
        tuner._decide(cache)
        assert tuner.expert == DEFAULT_EXPERTS[3] and len(tuner.switches) == 1

    def test_boundary_expert_adopted_during_warmup(self) -> None:
        """Only the first-boundary shadow hits these prefixes (on their 2nd use): its lead
        is unbounded, so the live cache follows it before the warm-up ends."""
        tuner = ShadowTuner(ShadowConfig(every=4, warmup=1000))
        cache = make_cache(SMALL, "1GB", "marconi+")
        hits = [_request(cache, inp, b, tuner) for inp, b in self._twice()]
        assert tuner.expert.boundaries is not Boundaries.NONE and hits[-1] == 200

    def test_an_early_leader_is_followed_at_once(self) -> None:
        """In the warm-up the leader is looked for after every request: the boundary
        expert's shadow hits the first prefix's 2nd use (request 2), the live cache follows
        it there and hits the next prefix's 2nd use (request 4); deciding every 16 requests
        it would have missed the first eight pairs (a 100-request trace lost 12.6 points
        so)."""
        tuner = ShadowTuner()  # no hedge (marconi+'s default), which would hit request 2
        cache = make_cache(SMALL, "1GB", "marconi+")
        hits = [_request(cache, inp, b, tuner) for inp, b in self._twice()[:6]]
        assert [s.at for s in tuner.switches] == [2]
        assert tuner.expert.boundaries is not Boundaries.NONE
        assert hits == [0, 0, 0, 200, 0, 200]

    def test_the_hedge_takes_every_admission_early(self) -> None:
        """Until the shadows tell which admission pays, the live cache checkpoints where
        any expert's admission would: the first prefix's boundary is checkpointed on its
        first use while the no-boundary expert runs, so its 2nd use (request 2) hits;
        without the hedge only the boundary expert, followed from request 2, checkpoints
        boundaries, from the next prefix on."""
        for hedge, expected in ((HEDGE, [0, 200, 0, 200]), (0, [0, 0, 0, 200])):
            tuner = ShadowTuner(ShadowConfig(hedge=hedge))
            cache = make_cache(SMALL, "1GB", "marconi+")
            tuner.start(cache)  # as a server does: request 1 runs under the tuner's choice
            hits = [_request(cache, inp, b, tuner) for inp, b in self._twice()[:4]]
            assert hits == expected, f"hedge {hedge}"
            check_integrity(cache)

    def test_only_the_hedge_variant_hedges(self) -> None:
        for name, hedge in (("marconi+", 0), ("marconi+-hedge", HEDGE)):
            tuner = get_system(name).make_tuner(None, TunerOptions())
            assert isinstance(tuner, ShadowTuner) and tuner.config.hedge == hedge

    def test_the_hedge_ends_after_its_requests(self) -> None:
        """During the hedge the live admission is every expert's at once (both boundaries
        and the overlap planner's positions, sequences kept whole); after `hedge` requests
        it is the running expert's alone."""
        tuner = ShadowTuner(ShadowConfig(hedge=3))
        cache = make_cache(SMALL, "1GB", "marconi+")
        admission = cache.admission
        assert isinstance(admission, Structured)
        for k, (inp, b) in enumerate(self._twice()[:5]):
            _request(cache, inp, b, tuner)
            assert tuner.hedging is (k + 1 < 3)
            config = admission.config
            if tuner.hedging:
                assert config.hedge and config.boundaries == 1 and config.tail
                assert not config.overlap and not admission.truncates
            else:
                assert not config.hedge
                assert config.boundaries == int(tuner.expert.boundaries is Boundaries.FIRST)
                assert config.tail is (tuner.expert.boundaries is Boundaries.LAST)

    def test_a_refused_commit_ends_the_hedge(self) -> None:
        """A cache too small for what the union admits refuses commits (a partly matched
        sequence it cannot evict, more states than fit): the hedge stops at the first."""
        tuner = ShadowTuner(ShadowConfig(hedge=HEDGE))
        room = 300 * SMALL.kv_bytes_per_token + 2 * SMALL.ssm_bytes
        cache = make_cache(SMALL, room, "marconi+")
        _request(cache, _seq(0, 100), (50,), tuner)
        assert tuner.hedging and cache.stats.refused_commits == 0
        _request(cache, _seq(10_000, 400), (50,), tuner)  # bigger than the cache
        assert cache.stats.refused_commits == 1 and not tuner.hedging
        assert not cache.admission.config.hedge  # type: ignore[attr-defined]

    def test_half_life_follows_the_recent_leader(self) -> None:
        """With `half_life` the decision weighs each request's saving 2^(-age / H): an
        expert far behind on the whole record but ahead lately is followed; without it,
        the whole record decides."""
        for half_life, followed in ((None, False), (64.0, True)):
            tuner = ShadowTuner(ShadowConfig(every=1, warmup=0, half_life=half_life))
            cache = make_cache(SMALL, "1GB", "marconi+")
            _request(cache, _seq(0, 10), tuner=tuner)  # starts the shadows
            tuner.totals[:] = 100.0
            tuner.totals[3] = 50.0
            tuner.recent[:] = 1.0
            tuner.recent[3] = 2.0
            tuner._decide(cache)
            assert (tuner.expert == DEFAULT_EXPERTS[3]) is followed
        tuner.recent[:] = 8.0
        _request(cache, _seq(5000, 10), tuner=tuner)  # a miss everywhere: decay only
        assert tuner.recent == pytest.approx(8.0 * 0.5 ** (1 / 64))

    @pytest.mark.parametrize("kwargs", [{"experts": ()}, {"every": 0}, {"early_every": 0},
                                        {"threshold": -1.0}, {"warmup": -1},
                                        {"early_threshold": -1.0}, {"half_life": 0.0},
                                        {"hedge": -1}])
    def test_config_validated(self, kwargs: dict) -> None:
        with pytest.raises(ValueError, match="ShadowConfig"):
            ShadowConfig(**kwargs)


@pytest.mark.parametrize("name", ["synthetic:twice", "synthetic:system-prompt",
                                  "synthetic:multi-turn"])
def test_marconi_plus_beats_or_ties_the_paper_systems(name: str) -> None:
    trace = load_trace(name, options=TraceOptions(sessions=60, seed=1))
    saved = {s: simulate(trace, SimConfig(spec=PAPER_7B, capacity="3GB", system=s,
                                          bounds=False, replay="sequential")).summary().flops_saved
             for s in ("sglang+", "marconi", "marconi+")}
    assert saved["marconi+"] >= 0.99 * max(saved["sglang+"], saved["marconi"])


def test_follows_a_flop_aware_expert_that_keeps_the_long_prefix() -> None:
    """A long conversation returns after five one-off short requests each time: LRU
    evicts it every time, Marconi's score at alpha 4 keeps it (a long prefix saves the
    most FLOPs per byte). The shadows see it and the live cache switches to the
    FLOP-aware expert."""
    from marconi.plus.admission import PLAIN, Structured

    long = _seq(0, 1000)
    capacity = 1000 * SMALL.kv_bytes_per_token + 4 * (60 * SMALL.kv_bytes_per_token
                                                      + SMALL.ssm_bytes)
    fa = Expert(Boundaries.NONE, Mode.MARCONI, 4.0)
    assert str(fa) == "none/marconi 4"
    tuner = ShadowTuner(ShadowConfig(experts=(Expert(Boundaries.NONE, Mode.LRU), fa),
                                     every=4))
    cache = PrefixCache(SMALL, capacity, Structured(PLAIN),
                        Switchable(SMALL, Mode.LRU, marconi=True))
    hits = []
    for i in range(30):
        hits.append(_request(cache, [*long, 1, 900_000 + i], tuner=tuner))
        for j in range(5):
            _request(cache, _seq(10_000 * (5 * i + j + 1), 50), tuner=tuner)
    assert tuner.expert == fa and cache.eviction.setting.alpha == 4.0  # type: ignore[attr-defined]
    assert hits[-1] == 1001 and tuner.totals[0] == 0 < tuner.totals[1]
    check_integrity(cache)
    for shadow in tuner.shadows:
        check_integrity(shadow)


def test_marconi_plus_decides_from_the_past_only() -> None:
    """Online: replaying the first k requests makes exactly the decisions the whole
    trace's replay made on them (no expert, shadow or switch looks ahead)."""
    trace = load_trace("synthetic:twice", options=TraceOptions(sessions=40, seed=2))
    config = SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi+", bounds=False,
                       replay="sequential")
    whole = simulate(trace, config)
    assert isinstance(whole.tuning, ShadowReport)
    assert whole.summary().evictions > 0 and whole.tuning.switches
    k = len(trace) // 2
    part = simulate(trace.requests[:k], config)
    assert isinstance(part.tuning, ShadowReport)
    assert np.array_equal(part.records.hit, whole.records.hit[:k])
    assert [s for s in whole.tuning.switches if s.at <= k] == list(part.tuning.switches)


class TestSampling:
    """Long streams: after `sample_after` requests the shadows see a `sample_rate` share
    of the sessions at that share of the capacity (a miniature simulation)."""

    CAPACITY = 2 * 1024**3

    def _trace(self):  # type: ignore[no-untyped-def]
        return load_trace("synthetic:multi-turn", options=TraceOptions(sessions=40, seed=3))

    def _run(self, requests, config: ShadowConfig, capacity: int,  # type: ignore[no-untyped-def]
             sessions: bool = True) -> ShadowTuner:
        cache = make_cache(PAPER_7B, capacity, "marconi+")
        tuner = ShadowTuner(config)
        for r in requests:
            tokens = r.tokens()
            cache.lookup(r.input_tokens, boundaries=r.boundaries)
            cache.commit(tokens, r.n_input, boundaries=r.boundaries)
            tuner.observe(cache, tokens, r.n_input, r.boundaries,
                          r.session_id if sessions else None)
        return tuner

    def test_sampled_shadows_are_the_sampled_sessions_at_the_scaled_capacity(self) -> None:
        """From request k on, the shadows' totals grow by exactly twice those of fresh
        unsampled shadows fed only the sampled sessions' later requests at half the
        capacity. (The message-boundary experts and sglang+'s: the overlap experts'
        placement is learnt from every request, sampled or not, so theirs differ.)"""
        from marconi.plus.shadows import _hash

        experts = tuple(e for e in DEFAULT_EXPERTS if e.boundaries is not Boundaries.OVERLAP)
        trace, k = self._trace(), 100
        sampled = self._run(trace, ShadowConfig(experts=experts, sample_after=k,
                                                sample_rate=0.5), self.CAPACITY)
        before = self._run(trace.requests[:k], ShadowConfig(experts=experts,
                                                            sample_after=None), self.CAPACITY)
        cut = 1 << 63
        kept = [r for r in trace.requests[k:] if _hash(r.session_id) < cut]
        assert 0 < len(kept) < len(trace) - k  # both halves are there
        alone = self._run(kept, ShadowConfig(experts=experts, sample_after=None),
                          self.CAPACITY // 2)
        assert alone.totals.max() > 0
        np.testing.assert_allclose(sampled.totals, before.totals + 2 * alone.totals,
                                   rtol=1e-12)
        assert [s.capacity for s in sampled.shadows] == [self.CAPACITY // 2] * len(experts)
        assert sum(s.stats.commits for s in sampled.shadows) == len(experts) * len(kept)
        report = sampled.report()
        assert (report.sampled_from, report.sample_rate) == (k, 0.5)
        assert report.to_json()["sampled_from"] == k

    def test_one_request_sessions_are_not_sampled(self) -> None:
        """A session per request (Mooncake's): reuse is across sessions, which a sample of
        sessions would split, so the shadows stay exact."""
        trace = [dataclasses.replace(r, session_id=f"r{i}")
                 for i, r in enumerate(self._trace())]
        tuner = self._run(trace, ShadowConfig(sample_after=100, sample_rate=0.5),
                          self.CAPACITY)
        assert tuner.sampled_from is None
        assert all(s.stats.commits == len(trace) for s in tuner.shadows)

    def test_no_session_names_kept_where_it_never_samples(self) -> None:
        """The session names counted for the rule are kept only until it is settled, and
        not at all when sampling is off: a huge trace's names would otherwise pile up."""
        trace = self._trace()
        exact = self._run(trace, ShadowConfig(sample_after=None), self.CAPACITY)
        assert exact._sessions is None
        settled = self._run(trace, ShadowConfig(sample_after=100), self.CAPACITY)
        assert settled._sessions is None and settled.sampled_from == 100
        pending = self._run(trace.requests[:50], ShadowConfig(sample_after=100), self.CAPACITY)
        assert pending._sessions is not None and len(pending._sessions) <= 50

    def test_a_stream_shorter_than_sample_after_is_not_sampled(self) -> None:
        trace = self._trace()
        config = ShadowConfig(sample_after=len(trace), sample_rate=0.5)
        tuner = self._run(trace, config, self.CAPACITY)
        exact = self._run(trace, ShadowConfig(sample_after=None), self.CAPACITY)
        assert tuner.sampled_from is None and tuner.report().to_json()["sampled_from"] is None
        assert np.array_equal(tuner.totals, exact.totals)

    def test_sampling_begins_at_sample_after(self) -> None:
        trace = self._trace()
        tuner = self._run(trace, ShadowConfig(sample_after=100, sample_rate=0.25),
                          self.CAPACITY)
        assert tuner.sampled_from == 100
        assert [s.capacity for s in tuner.shadows] == [self.CAPACITY // 4] * len(DEFAULT_EXPERTS)

    def test_a_driver_that_names_no_session_is_never_sampled(self) -> None:
        """The engine passes no session: its shadows see every request."""
        trace = self._trace()
        tuner = self._run(trace, ShadowConfig(sample_after=0, sample_rate=0.5),
                          self.CAPACITY, sessions=False)
        assert tuner.sampled_from is None
        assert all(s.stats.commits == len(trace) for s in tuner.shadows)

    def test_the_simulator_names_sessions(self) -> None:
        """A replay longer than `shadow_sample_after` samples (the simulator passes
        sessions, in order and concurrent); the default leaves short traces exact."""
        from marconi.sim.result import SHADOW_SAMPLE_AFTER
        from marconi.sim.summary import Summary

        trace = self._trace()
        default = SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi+")
        assert default.shadow_sample_after == SHADOW_SAMPLE_AFTER > len(trace)
        tuner = get_system("marconi+").make_tuner(None, TunerOptions(settings=default.settings()))
        assert isinstance(tuner, ShadowTuner)
        assert tuner.config.sample_after == SHADOW_SAMPLE_AFTER  # the setting reaches it
        for concurrent in (False, True):
            config = SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi+", bounds=False,
                               concurrent=concurrent, shadow_sample_after=100,
                               replay="sequential")
            result = simulate(trace, config)
            assert isinstance(result.tuning, ShadowReport)
            assert result.tuning.sampled_from == 100
            summary = result.summary()
            row = summary.to_row()  # a sweep's row keeps it, and says it
            assert (row["shadows_sampled_from"], row["shadows_sample_rate"]) == (100, 0.125)
            cell = {"system": "x", "trace": "t", "capacity": "2GB", "model": "paper-7b"}
            back = Summary.from_row(cell | row)
            assert any("from request 100 on" in m for m in run_warnings(back))


class TestTwins:
    """Until a request names a message boundary, the boundary experts' shadows equal their
    no-boundary twins' and are not fed; at the first boundary they part as copies."""

    CAPACITY = 2 * 1024**3

    @staticmethod
    def _shape(cache: PrefixCache) -> Snapshot:
        """The tree, its states and stamps, and the clock, in walk order (either core)."""
        return take(cache)

    def _run(self, requests, twins: bool):  # type: ignore[no-untyped-def]
        cache = make_cache(PAPER_7B, self.CAPACITY, "marconi+")
        tuner = ShadowTuner(ShadowConfig(sample_after=None, every=4))
        tuner.start(cache)
        if not twins:
            tuner._twins = {}
        for r in requests:
            tokens = r.tokens()
            cache.lookup(r.input_tokens, boundaries=r.boundaries)
            cache.commit(tokens, r.n_input, boundaries=r.boundaries)
            tuner.observe(cache, tokens, r.n_input, r.boundaries, r.session_id)
        return tuner

    @pytest.mark.parametrize("core", CORES)
    @pytest.mark.parametrize("plain_first", [0, 1, 150, 10_000])
    def test_the_same_as_feeding_every_shadow(self, plain_first: int, core: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
        """The first `plain_first` requests name no boundary (all of them: a Mooncake-like
        trace); the totals, switches and every shadow's tree and books are those of
        shadows all fed every request (the shadows on either core: a compiled shadow
        parts as a copy of its compiled twin)."""
        if core == "compiled" and not built():
            pytest.skip("the compiled core is not built")
        monkeypatch.setenv(CORE_ENV, core)
        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=40, seed=3))
        requests = [dataclasses.replace(r, boundaries=()) if i < plain_first else r
                    for i, r in enumerate(trace)]
        assert any(r.boundaries for r in requests[plain_first:]) or plain_first >= len(trace)
        twinned, fed = self._run(requests, twins=True), self._run(requests, twins=False)
        assert np.array_equal(twinned.totals, fed.totals)
        assert twinned.switches == fed.switches and twinned.expert == fed.expert
        parted = plain_first < len(requests)
        assert bool(twinned._twins) is not parted
        for k, (a, b) in enumerate(zip(twinned.shadows, fed.shadows, strict=True)):
            if k in twinned._twins:  # never fed: its twin stands for it
                assert a.stats.commits == 0
                a = twinned.shadows[twinned._twins[k]]
            assert getattr(a, "compiled", False) is (core == "compiled")
            assert self._shape(a) == self._shape(b)
            assert a.stats.as_dict() == b.stats.as_dict()
            check_integrity(a)
        if parted and plain_first:  # a parted shadow is a copy, not its twin
            a, b = twinned.shadows[3], twinned.shadows[0]
            assert a is not b
            if core == "compiled":
                assert a._core is not b._core  # type: ignore[attr-defined]
            else:
                assert a.tree.root is not b.tree.root


class TestSglangExpert:
    """`sglang+`'s configuration is one of marconi+'s experts, and the switching rule
    keeps marconi+ near it (docs/architecture.md, "marconi+'s regret")."""

    @pytest.mark.parametrize("name", ["synthetic:rag", "synthetic:branching",
                                      "synthetic:multi-turn"])
    def test_its_shadow_replays_sglang_plus_exactly(self, name: str) -> None:
        """The expert's shadow saves what `sglang+` itself saves, to the FLOP: same
        admission (judicious), same LRU order, same capacity (a shadow 2% smaller parts
        them)."""
        trace = load_trace(name, options=TraceOptions(sessions=40, seed=3))
        runs = {s: simulate(trace, SimConfig(spec=PAPER_7B, capacity="500MB", system=s,
                                             bounds=False, replay="sequential")).summary()
                for s in ("sglang+", "marconi+")}
        experts = runs["marconi+"].experts
        assert experts is not None and runs["sglang+"].evictions > 0
        assert experts.saved[str(SGLANG_PLUS)] == runs["sglang+"].flops_saved_rate
        margin = runs["marconi+"].flops_saved_rate - runs["sglang+"].flops_saved_rate
        assert experts.sglang_margin == pytest.approx(margin, abs=1e-12)

    def test_a_small_lead_of_sglang_is_followed(self) -> None:
        """0.5% ahead of the running expert (under the 5% threshold) but more than `lead`
        of the possible: `sglang+`'s configuration is followed; any other expert with
        the same lead is not."""
        config = ShadowConfig()
        safe = DEFAULT_EXPERTS.index(SGLANG_PLUS)
        score = np.full(len(DEFAULT_EXPERTS), 40.0)
        score[safe] = 40.2
        assert leader(score, 0, 1000, config, possible=100.0, safe=safe) == safe
        assert leader(score, 0, 1000, config, possible=100.0) == 0  # no safe expert named
        assert leader(score, 0, 1000, config, possible=400.0, safe=safe) == 0  # 0.05 pt
        score[safe], score[3] = 40.0, 40.2
        assert leader(score, 0, 1000, config, possible=100.0, safe=safe) == 0

    def test_the_guard_runs_sglang_while_the_live_cache_trails_it(self) -> None:
        """The running expert's shadow leads every other (it never paid its switch), but
        the live cache itself saved 0.5 point less than `sglang+`'s shadow: the guard runs
        `sglang+`'s configuration; 0.05 point behind, it does not; no live record given
        (the integrations), no guard."""
        config = ShadowConfig()
        safe = DEFAULT_EXPERTS.index(SGLANG_PLUS)
        score = np.full(len(DEFAULT_EXPERTS), 40.0)
        score[2] = 45.0
        assert leader(score, 2, 1000, config, 100.0, safe, live=39.5) == safe
        assert leader(score, 2, 1000, config, 100.0, safe, live=39.95) == 2
        assert leader(score, 2, 1000, config, 100.0, safe) == 2
        assert leader(score, safe, 1000, config, 100.0, safe, live=39.5) == safe  # it stays

    def test_a_guard_that_fired_does_not_hold_for_ever(self) -> None:
        """The live cache trails `sglang+`'s shadow by 5 points at request 64 (a bad
        start): the guard fires and runs `sglang+`'s configuration. From then on the
        live cache earns what that shadow earns, so the 5 points are never made up; when
        another expert then saves half as much again per request as `sglang+`'s, it is
        followed (the record restarts where the guard fired), not held off by the paid
        deficit: on a clear lead after `settle` (32) requests of the new record, not on
        the relative lead of its first few; after a second fire, after 64."""
        tuner = ShadowTuner(ShadowConfig(every=1))
        cache = make_cache(SMALL, "1GB", "marconi+")
        _request(cache, _seq(0, 10), tuner=tuner)  # starts the shadows
        safe, other = DEFAULT_EXPERTS.index(SGLANG_PLUS), 3
        tuner.seen, tuner.possible = 64, 100.0
        tuner.totals[:] = 30.0
        tuner.live = 25.0  # 5 points behind every shadow, `sglang+`'s among them

        def requests(n: int, live: float) -> None:
            for _ in range(n):
                tuner.seen += 1
                tuner.possible += 1.0
                tuner.totals += 0.4
                tuner.totals[other] += 0.2  # saves 0.6 a request against 0.4
                tuner.live += 0.4 if tuner.current == safe else live  # `sglang+`'s: its rate
                tuner._decide(cache)

        tuner._decide(cache)
        assert tuner.expert == SGLANG_PLUS and tuner.guard_fires == 1
        requests(100, 0.4)  # the deficit stays
        assert tuner.current == other and tuner.guard_fires == 1
        assert tuner.switches[-1].at == 64 + 32
        # the live cache running `other` earns less than `sglang+`'s shadow: it fires again
        while tuner.guard_fires < 2 and tuner.seen < 1000:
            requests(1, 0.3)
        assert tuner.guard_fires == 2 and tuner.expert == SGLANG_PLUS
        fired = tuner.seen
        requests(64, 0.3)
        assert tuner.current == other and tuner.switches[-1].at == fired + 64
        # the bound against `sglang+` (no warm-up total kept here: the whole total counts)
        # adds each closed record's average request (100 / 64, then 1: a request's possible
        # is 1 since) and a decision window per fire
        sglang, window = tuner.totals[safe], 1 / tuner.seen
        assert tuner.report().sglang_bound == pytest.approx(
            tuner.config.lead * tuner.possible + sglang + 100 / 64 + 1 + 3 * window * sglang)

    def test_held_by_the_guard_a_relative_lead_is_not_enough(self) -> None:
        """After the guard fired, an expert that leads on the whole record but saves, on
        the record since, half as much again as `sglang+`'s at a tenth of a point of the
        possible a request, is not followed: on the record since, only a clear lead is
        (2 points and one average request)."""
        tuner = ShadowTuner(ShadowConfig(every=1))
        cache = make_cache(SMALL, "1GB", "marconi+")
        _request(cache, _seq(0, 10), tuner=tuner)  # starts the shadows
        other = 3
        tuner.seen, tuner.possible = 64, 100.0
        tuner.totals[:] = 30.0
        tuner.totals[other] = 50.0  # far ahead on the whole record
        tuner.live = 25.0
        tuner._decide(cache)
        assert tuner.expert == SGLANG_PLUS
        for _ in range(200):
            tuner.seen += 1
            tuner.possible += 1.0
            tuner.totals += 0.002
            tuner.totals[other] += 0.001  # 50% more, 0.1 point of a request's possible
            tuner.live += 0.002
            tuner._decide(cache)
        assert tuner.expert == SGLANG_PLUS and tuner.guard_fires == 1

    def test_the_live_record_is_what_the_run_saved(self) -> None:
        """The tuner's own count of what the live cache saved is the run's FLOPs saved."""
        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=30, seed=2))
        config = SimConfig(spec=PAPER_7B, capacity="400MB", system="marconi+", bounds=False,
                        replay="sequential")
        tuner = get_system("marconi+").make_tuner(options=TunerOptions())
        assert isinstance(tuner, ShadowTuner)
        cache = make_cache(PAPER_7B, "400MB", "marconi+")
        for request in trace.requests:
            tokens = request.tokens()
            cache.lookup(request.input_tokens, boundaries=request.boundaries)
            cache.commit(tokens, request.n_input, boundaries=request.boundaries)
            tuner.observe(cache, tokens, request.n_input, request.boundaries)
        summary = simulate(trace, config).summary()
        assert tuner.live == pytest.approx(summary.flops_saved, rel=1e-12)
        assert tuner.possible == pytest.approx(summary.flops_total, rel=1e-12)

    def test_a_clear_lead_is_followed_in_the_warmup(self) -> None:
        """In the warmup a leader needs 5% more than the running expert's total, or a lead
        of `clear_lead` (2 points) of the possible worth one average request: 4.5% ahead
        at 2.25 points is followed."""
        config = ShadowConfig()
        score = np.full(len(DEFAULT_EXPERTS), 20.0)
        score[4] = 20.9
        assert leader(score, 0, 64, config, possible=40.0) == 4
        assert leader(score, 0, 64, config, possible=100.0) == 0  # 0.9 points: noise
        assert leader(score, 0, 64, config) == 0  # no possible given (the integrations)

    def test_the_rule_keeps_the_running_expert_within_its_margins(self) -> None:
        """After every decision past the warmup (and `settle`), what the bound is built on
        holds: the running expert's shadow trails `sglang+`'s by at most `lead` of the
        possible, and the best by at most the threshold or the clear lead (each at least
        one average request), unless the guard holds `sglang+`'s configuration (on the
        record since it last fired, or on the whole record while the live cache trails
        there)."""
        trace = load_trace("synthetic:branching", options=TraceOptions(sessions=60, seed=7))
        config = ShadowConfig(every=4, warmup=16)
        tuner = ShadowTuner(config)
        cache = make_cache(PAPER_7B, "600MB", "marconi+")
        safe, decided = DEFAULT_EXPERTS.index(SGLANG_PLUS), 0
        for request in trace.requests:
            tokens = request.tokens()
            cache.lookup(request.input_tokens, boundaries=request.boundaries)
            cache.commit(tokens, request.n_input, boundaries=request.boundaries)
            tuner.observe(cache, tokens, request.n_input, request.boundaries)
            if tuner.seen % config.every or tuner.seen < max(config.warmup, config.settle):
                continue
            decided += 1
            totals, run = tuner.totals, tuner.totals[tuner.current]
            floor = tuner.possible / tuner.seen  # a lead must be worth a request
            margin = max(config.lead * tuner.possible, floor)
            if tuner.since is not None:  # the guard's record since it last fired
                at = tuner.since
                gap, possible = (totals[safe] - at[0][safe]) - (tuner.live - at[1]), \
                    tuner.possible - at[2]
                requests = tuner.seen - at[3]
            else:
                gap, possible, requests = totals[safe] - tuner.live, tuner.possible, tuner.seen
            if requests >= config.settle and gap > max(config.lead * possible, possible / requests):
                assert tuner.current == safe  # the guard holds sglang+'s
                continue
            if tuner.current == safe and totals[safe] - tuner.live > margin:
                continue  # held: a leader must lead on the record since too
            assert totals[safe] - run <= margin + 1e-6
            assert totals.max() - run <= min(config.threshold * run, max(
                config.clear_lead * tuner.possible, floor)) + 1e-6
        assert decided > 10 and tuner.switches
        assert tuner.report().ran[SGLANG_PLUS] > 0  # it did fall back on sglang+'s

    def test_a_regret_past_the_bound_warns(self) -> None:
        """The warning names what exceeded its bound; within both, nothing is said."""
        from marconi.sim.summary import Experts
        from marconi.sim.warnings import regret_warning

        trace = load_trace("synthetic:rag", options=TraceOptions(sessions=40, seed=3))
        summary = simulate(trace, SimConfig(spec=PAPER_7B, capacity="500MB",
                                            system="marconi+", bounds=False,
                                            replay="sequential")).summary()
        experts = summary.experts
        assert experts is not None and experts.bound is not None
        assert experts.regret == pytest.approx(experts.saved[experts.best]
                                               - summary.flops_saved_rate)
        assert regret_warning(summary) is None
        over = dataclasses.replace(experts, regret=experts.bound + 0.01)
        message = regret_warning(dataclasses.replace(summary, experts=over))
        assert message is not None and "above the" in message and experts.best in message
        behind = dataclasses.replace(experts, sglang_margin=-(experts.sglang_bound or 0) - 0.01)
        message = regret_warning(dataclasses.replace(summary, experts=behind))
        assert message is not None and "trails sglang+'s configuration" in message
        # served, the shadows are served too (`ShadowTuner.scheduled`): the bound is checked
        served = simulate(trace, SimConfig(spec=PAPER_7B, capacity="500MB",
                                           system="marconi+", bounds=False)).summary()
        assert served.replay == "serving" and served.experts is not None
        assert served.experts.regret == pytest.approx(
            served.experts.saved[served.experts.best] - served.flops_saved_rate)
        over = dataclasses.replace(served.experts, regret=served.experts.bound + 0.01)
        message = regret_warning(dataclasses.replace(served, experts=over))
        assert message is not None and "above the" in message
        sampled = dataclasses.replace(over, sampled=True)
        assert regret_warning(dataclasses.replace(summary, experts=sampled)) is None
        assert isinstance(Experts.from_report({"totals": {}}, 0.5), type(None))
