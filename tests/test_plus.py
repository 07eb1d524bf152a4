"""marconi+ pieces: structured admission, switchable eviction, the guarded re-tuner (the
first design, `marconi+-guarded`), concurrency-aware replay."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from marconi.cache import PrefixCache
from marconi.integrity import check_integrity
from marconi.policies.plus import Mode, Setting, StructureConfig, Structured, Switchable
from marconi.retuner import LRU, GuardedTuner, RetuneConfig, guard
from marconi.shadows import Boundaries, Expert, apply
from marconi.sim.replay import SimConfig, simulate
from marconi.spec import PAPER_7B
from marconi.workload import load_trace
from marconi.workload.types import Request, Trace
from tests.helpers import SMALL

SYSTEM = list(range(1000, 1100))  # a 100-token shared system prompt


def _hits(system: str, n: int = 3, expert: Expert | None = None) -> list[int]:
    cache = PrefixCache(SMALL, "1TB", system)
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
        cache = PrefixCache(SMALL, "1TB", "marconi+-guarded")
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


class TestGuard:
    def test_keeps_current_below_threshold(self) -> None:
        cur, other = Setting(Mode.FLOP, 0.5), Setting(Mode.FLOP, 1.5)
        assert guard({cur: 100.0, other: 100.5, LRU: 90.0}, cur, 0.01) == cur
        assert guard({cur: 100.0, other: 102.0, LRU: 90.0}, cur, 0.01) == other

    def test_ties_prefer_lru(self) -> None:
        cur = Setting(Mode.FLOP, 1.0)
        assert guard({cur: 1.0, LRU: 5.0, Setting(Mode.FLOP, 0.0): 5.0}, cur, 0.0) == LRU


class TestSwitchable:
    def test_lru_mode_evicts_like_sglang(self) -> None:
        caches = [PrefixCache(SMALL, 400_000, s, alpha=0.0, tuner=None)
                  for s in ("sglang+", "marconi+")]
        assert isinstance(caches[1].eviction, Switchable)
        caches[1].eviction.set_setting(LRU)
        rng = np.random.default_rng(0)
        for _ in range(60):
            inp = rng.integers(0, 4, 30).tolist()
            hits = {c.lookup(inp).hit for c in caches}
            assert len(hits) == 1
            for c in caches:
                c.commit([*inp, 1], len(inp))
            check_integrity(caches[1])


class BlockingExecutor(ThreadPoolExecutor):
    """Holds every task until `release` is set; `ran` counts the tasks that finished."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.release = threading.Event()
        self.ran = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        def blocked():  # type: ignore[no-untyped-def]
            self.release.wait(10)
            result = fn(*args, **kwargs)
            self.ran += 1
            return result

        return super().submit(blocked)


class TestTuner:
    def _feed(self, cache: PrefixCache, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(n):
            inp = rng.integers(0, 50, 40).tolist()
            cache.lookup(inp)
            cache.commit([*inp, 1], len(inp))

    def test_wait_false_never_blocks(self) -> None:
        executor = BlockingExecutor()
        tuner = GuardedTuner(RetuneConfig(min_window=4, max_window=8), executor=executor,
                             wait=False)
        cache = PrefixCache(SMALL, 300_000, "marconi+-guarded", tuner=tuner)
        self._feed(cache, 60)
        # every request was served while the replay sat blocked: no commit waited for it
        assert tuner.busy and not tuner.history and executor.ran == 0
        executor.release.set()
        executor.submit(lambda: None).result()  # one worker: the replay has finished
        self._feed(cache, 1, seed=1)
        assert tuner.history and tuner.history[0].scores
        check_integrity(cache)
        executor.shutdown(wait=True)

    def test_retunes_periodically_and_records(self) -> None:
        tuner = GuardedTuner(RetuneConfig(min_window=8, max_window=8))
        cache = PrefixCache(SMALL, 300_000, "marconi+-guarded", tuner=tuner)
        self._feed(cache, 100)
        assert len(tuner.history) >= 3
        assert all(LRU in r.scores for r in tuner.history)
        check_integrity(cache)


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
                           concurrent=concurrent, bounds=False)
        assert simulate(trace, config).records["hit"].tolist() == hits


def test_readers_carry_boundaries() -> None:
    trace = load_trace("synthetic:system-prompt:sessions=3")
    assert all(r.boundaries == (1024,) for r in trace)
    chat = load_trace("synthetic:multi-turn:sessions=1,turns=3")
    assert chat[0].boundaries == (256,) and len(chat[2].boundaries) == 5
