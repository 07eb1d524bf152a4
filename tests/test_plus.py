"""marconi+ pieces: structured admission, switchable eviction, concurrency-aware replay."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.spec import PAPER_7B
from marconi.core.tree import RadixTree
from marconi.paper.eviction import LRULeaf
from marconi.plus.admission import PLAIN, StructureConfig, Structured
from marconi.plus.greedy_dual import GreedyDualFlop
from marconi.plus.shadows import Boundaries, Expert, ShadowReport, apply
from marconi.plus.switchable import Mode, Setting, Switchable
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.systems import make_cache
from marconi.workload import load_trace
from marconi.workload.types import Request, Trace
from tests.helpers import SMALL

SYSTEM = list(range(1000, 1100))  # a 100-token shared system prompt


def _hits(system: str, n: int = 3, expert: Expert | None = None) -> list[int]:
    cache = make_cache(SMALL, "1TB", system)
    if expert is not None:
        apply(cache, expert)
    hits = []
    for i in range(n):
        inp = SYSTEM + [i] * 20
        hits.append(cache.lookup(inp, boundaries=(len(SYSTEM),)).hit)
        cache.commit([*inp, 7], len(inp), boundaries=(len(SYSTEM),))
    return hits


class TestStructured:
    def test_system_prompt_hits_on_second_occurrence(self) -> None:
        assert _hits("marconi+-gd", expert=Expert(Boundaries.FIRST, Mode.FLOP)) == [0, 100, 100]
        assert _hits("marconi+-gd", expert=Expert(Boundaries.NONE, Mode.FLOP)) == [0, 0, 100]
        assert _hits("sglang+") == [0, 0, 100]  # judicious: the third

    def test_partial_hit_admitted_on_repeat(self) -> None:
        cache = PrefixCache(SMALL, "1TB", Structured(StructureConfig()), LRULeaf())
        long = list(range(2000))
        cache.lookup(long)
        cache.commit(long, len(long))
        prefix = long[:1500]  # a prefix of a cached sequence: KV matches, no state
        assert [cache.lookup(prefix).hit for _ in range(2)] == [0, 0]
        cache.commit(prefix, len(prefix))  # second sighting: checkpoint at 1500 admitted
        assert cache.lookup(prefix).hit == 1500

    def test_config_is_validated(self) -> None:
        with pytest.raises(ValueError):
            StructureConfig(repeats=0)
        with pytest.raises(ValueError):
            Structured(StructureConfig(boundaries=-1))


class TestSwitchable:
    def test_lru_mode_evicts_like_sglang(self) -> None:
        caches = [make_cache(SMALL, 400_000, s) for s in ("sglang+", "marconi+")]
        assert isinstance(caches[1].eviction, Switchable)
        caches[1].eviction.set_setting(Setting(Mode.LRU))
        rng = np.random.default_rng(0)
        for _ in range(60):
            inp = rng.integers(0, 4, 30).tolist()
            hits = {c.lookup(inp).hit for c in caches}
            assert len(hits) == 1
            for c in caches:
                c.commit([*inp, 1], len(inp))
            check_integrity(caches[1])

    @pytest.mark.parametrize("mode", [Mode.DENSITY, Mode.DEPTH, Mode.LRU])
    def test_greedy_dual_follows_the_running_experts_victims(self, mode: Mode) -> None:
        """Each victim another expert chooses raises GreedyDual's level to the lowest
        score GreedyDual holds then (`Eviction.follow`); running, it raises its own."""
        policy = Switchable(SMALL, mode)
        gd = policy.flop
        assert isinstance(gd, GreedyDualFlop)
        tree = RadixTree()
        leaves = [tree.insert(tree.root, np.arange(i, i + 3 * i + 5, dtype=np.int32)
                              .tobytes()) for i in range(1, 6)]
        policy.on_commit(leaves, leaves, 1)  # LRU touches the path, the others `new`
        lowest = float(gd.scores(2).min())
        assert gd.level == 0.0 < lowest
        assert policy.victim((), 2) is not None
        assert gd.level == lowest
        policy.set_setting(Setting(Mode.FLOP))
        chosen = policy.victim((), 3)
        assert chosen is not None and gd.level == lowest  # its own victim: the same low
        assert set(policy._followers) == {Mode.FLOP}  # only GreedyDual's order keeps up



def _request(i: int, arrival: float, tokens: list[int]) -> Request:
    return Request(session_id=str(i), turn=0, arrival=arrival,
                   input_tokens=np.array(tokens, dtype=np.int32),
                   output_tokens=np.array([5] * 10, dtype=np.int32))


def test_concurrent_replay_commits_at_finish() -> None:
    first = [*range(3000), 1]
    second = [*first, *[5] * 10, 2]  # continues the first request's output
    trace = Trace("t", (_request(0, 0.0, first), _request(1, 0.001, second),
                        _request(2, 100.0, [*second, 3])))
    # overlapping, the second request finds nothing: the first has not finished
    for concurrent, hits in ((False, [0, 3011, 3011]), (True, [0, 0, 3011])):
        config = SimConfig(spec=PAPER_7B, capacity="100GB", system="sglang+",
                           concurrent=concurrent, bounds=False, replay="sequential")
        assert simulate(trace, config).records.hit.tolist() == hits


def test_readers_carry_boundaries() -> None:
    trace = load_trace("synthetic:system-prompt:sessions=3")
    assert all(r.boundaries == (1024,) for r in trace)
    chat = load_trace("synthetic:multi-turn:sessions=1,turns=3")
    assert chat[0].boundaries == (256,) and len(chat[2].boundaries) == 5


def test_concurrent_replay_drives_the_tuner() -> None:
    """The driver tunes: under overlap, marconi+'s shadows see every commit."""
    trace = load_trace("synthetic:system-prompt:sessions=4")
    config = SimConfig(spec=PAPER_7B, capacity="100GB", system="marconi+", concurrent=True,
                       replay="sequential", bounds=False)
    tuning = simulate(trace, config).tuning
    assert isinstance(tuning, ShadowReport) and tuning.requests == len(trace)


class TestMarconiMode:
    """Switchable's MARCONI mode: Marconi's FLOP-aware score at an alpha the tuner sets."""

    @staticmethod
    def _work(n: int = 80) -> list[list[int]]:
        rng = np.random.default_rng(3)
        return [rng.integers(0, 6, int(rng.integers(20, 400))).tolist() for _ in range(n)]

    def test_evicts_like_marconi_at_the_same_alpha(self) -> None:
        for alpha in (0.5, 4.0):
            marconi = make_cache(SMALL, 300_000, "marconi", alpha=alpha)
            plus = PrefixCache(SMALL, 300_000, Structured(PLAIN),
                               Switchable(SMALL, Mode.DENSITY, marconi=True))
            assert isinstance(plus.eviction, Switchable)
            plus.eviction.set_setting(Setting(Mode.MARCONI, alpha))
            assert plus.eviction.setting == Setting(Mode.MARCONI, alpha)
            for inp in self._work():
                assert marconi.lookup(inp).hit == plus.lookup(inp).hit
                marconi.commit([*inp, 1], len(inp))
                plus.commit([*inp, 1], len(inp))
            assert marconi.stats.evictions == plus.stats.evictions > 0
            check_integrity(plus)

    def test_switching_in_mid_run_finds_its_books_current(self) -> None:
        """The FLOP-aware books (last touch, efficiency) follow the tree's events whoever
        chooses the victims: after a run under hit density, the switched-in order is
        Marconi's score over the current candidates."""
        cache = PrefixCache(SMALL, 300_000, Structured(PLAIN),
                            Switchable(SMALL, Mode.DENSITY, marconi=True))
        policy = cache.eviction
        assert isinstance(policy, Switchable) and policy.marconi is not None
        work = self._work()
        for inp in work[:50]:
            cache.lookup(inp)
            cache.commit([*inp, 1], len(inp))
        assert cache.stats.evictions > 0
        check_integrity(cache)  # every expert's books, the FLOP-aware one's among them
        policy.set_setting(Setting(Mode.MARCONI, 2.0))
        victim = policy.victim((), 10**6)
        assert victim is not None
        scores = policy.marconi.scores(10**6)
        assert victim.node is policy.marconi.columns.nodes[int(np.argmin(scores))]
        for inp in work[50:]:
            cache.lookup(inp)
            cache.commit([*inp, 1], len(inp))
        check_integrity(cache)

    def test_needs_the_expert(self) -> None:
        with pytest.raises(ValueError, match="FLOP-aware"):
            Switchable(SMALL, Mode.DENSITY).set_setting(Setting(Mode.MARCONI, 1.0))
        with pytest.raises(ValueError, match="alpha"):
            Switchable(SMALL, marconi=True).set_setting(Setting(Mode.MARCONI, -1.0))


@pytest.mark.parametrize("core", ["python", "compiled"])
def test_served_marconi_plus_starts_on_the_first_boundary_as_its_server_does(
        core: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving replay runs marconi+ as `marconi serve` does: its live cache starts on
    the expert that checkpoints the first message's end, so a system prompt shared by
    requests that never overlap hits on its second use. The sequential replay starts on
    plain judicious admission: there the second use misses (no state at the prompt's end)
    and the third hits, once the first-boundary expert's shadow leads."""
    from marconi.core import compiled

    monkeypatch.setenv(compiled.CORE_ENV, core)
    rng = np.random.default_rng(7)
    prompt = rng.integers(1000, 30_000, 600).astype(np.int32)
    requests = []
    for i in range(3):
        user = rng.integers(1000, 30_000, 200).astype(np.int32)
        requests.append(Request(
            session_id=f"s{i}", turn=0, arrival=1000.0 * i,
            input_tokens=np.concatenate([prompt, user]),
            output_tokens=rng.integers(1000, 30_000, 8).astype(np.int32), boundaries=(600,)))
    trace = Trace("system prompt", tuple(requests), {})
    hits = {}
    for replay in ("serving", "sequential"):
        config = SimConfig(replay=replay, spec=SMALL, capacity="1GB", system="marconi+",
                           bounds=False)
        hits[replay] = simulate(trace, config).records.hit.tolist()
    assert hits["serving"] == [0, 600, 600]
    assert hits["sequential"] == [0, 0, 600]
