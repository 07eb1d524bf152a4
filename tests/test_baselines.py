"""The baselines beside the paper's and the engines' (docs/peers.md, "Other baselines"):
each one's defining behaviour on a tiny hand-made trace."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.sim.result import OFFLINE, REUSE_ORACLE, SimConfig
from marconi.sim.run import run
from marconi.systems import SYSTEMS, get_system
from marconi.workload.types import Request, Trace
from tests.helpers import SMALL

# SMALL: KV 256 bytes a token, a state 81,920 bytes
KV, STATE = SMALL.kv_bytes_per_token, SMALL.ssm_bytes


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def trace(*inputs: list[int], sessions: list[str] | None = None) -> Trace:
    """One request per input, no output; each its own session unless `sessions`."""
    names = sessions or [f"s{i}" for i in range(len(inputs))]
    turns: dict[str, int] = {}
    requests = []
    for i, (tokens, session) in enumerate(zip(inputs, names, strict=True)):
        turns[session] = turns.get(session, -1) + 1
        requests.append(Request(session_id=session, turn=turns[session], arrival=float(i),
                                input_tokens=np.asarray(tokens, dtype=np.int32),
                                output_tokens=np.zeros(0, dtype=np.int32)))
    return Trace(name="hand-made", requests=tuple(requests))


def hits(system: str, t: Trace, capacity: int) -> list[int]:
    config = SimConfig(spec=SMALL, capacity=capacity, system=system, bounds=False,
                       replay="sequential")  # the references read a sequential future
    return [int(h) for h in run(t, config, warn=False).records.hit]


class TestReuseOracle:
    """Sequences A, B, C of 100 tokens, then A extended; room for two of them. LRU drops A
    (the oldest) for C; told that B is never reused, `reuse-oracle` drops B and A hits."""

    T = trace(seq(0, 100), seq(1000, 100), seq(2000, 100), seq(0, 100) + seq(5000, 20))
    CAPACITY = 2 * (100 * KV + STATE) + 1000

    def test_it_keeps_what_is_reused(self) -> None:
        assert hits("sglang+", self.T, self.CAPACITY) == [0, 0, 0, 0]
        assert hits(REUSE_ORACLE, self.T, self.CAPACITY) == [0, 0, 0, 100]

    # room for two sequences, not three; or for A split at 60 and D's new 20 tokens
    ROOM = 3 * (100 * KV + STATE) - 40_000

    def test_a_leaf_two_later_requests_branch_in_is_reused(self) -> None:
        """D and E share 60 of A's 100 tokens and neither spells A out. Keeping A lets
        judicious admission find D's branch point inside A and checkpoint it, and E hits
        that state, so A counts as reused and B, which no one shares, goes first. Counting
        only requests that spell an entry out, A and B both look dead; A goes, and E
        misses (what made the reference save less than LRU on Mooncake-like traces)."""
        t = trace(seq(0, 100), seq(1000, 100), seq(2000, 100), seq(0, 60) + seq(7000, 20),
                  seq(0, 60) + seq(8000, 20))
        assert hits("sglang+", t, self.ROOM) == [0, 0, 0, 0, 0]
        assert hits(REUSE_ORACLE, t, self.ROOM) == [0, 0, 0, 0, 60]

    def test_one_later_request_sharing_a_leaf_is_no_reuse(self) -> None:
        """Only D shares (95 of) A's tokens: its branch checkpoint would serve no one, so A
        is not kept for it; B, which E extends, is, though it was touched before A."""
        t = trace(seq(1000, 100), seq(0, 100), seq(2000, 100), seq(0, 95) + seq(7000, 5),
                  seq(1000, 100) + seq(9000, 10))
        assert hits(REUSE_ORACLE, t, self.ROOM) == [0, 0, 0, 0, 100]

    def test_it_is_no_registered_system(self) -> None:
        """Only the simulator knows the future: every other face refuses the name (the
        server, the engine and `make_cache` all go through `get_system`)."""
        from marconi.server.config import ServerConfig

        assert REUSE_ORACLE not in SYSTEMS
        for name in (OFFLINE, REUSE_ORACLE):
            with pytest.raises(ValueError, match=f"unknown system '{name}'"):
                get_system(name)
            with pytest.raises(ValueError, match=f"unknown system '{name}'"):
                ServerConfig(system=name)


class TestSegLen:
    """A (200 tokens) oldest, then B and C (20 each); D needs one of them to leave. LRU
    drops A; SegLen weighs A's long replay: scores A 0 + 0.85, B 0.5 + 0, C 1 + 0, so B
    goes, and A's extension hits all of A."""

    T = trace(seq(0, 200), seq(1000, 20), seq(2000, 20), seq(3000, 20),
              seq(0, 200) + seq(5000, 10))
    CAPACITY = (200 * KV + STATE) + 2 * (20 * KV + STATE) + 1000

    def test_long_replays_stay(self) -> None:
        assert hits("sglang+", self.T, self.CAPACITY) == [0, 0, 0, 0, 0]
        assert hits("seglen", self.T, self.CAPACITY) == [0, 0, 0, 0, 200]

    def test_weight_zero_is_recency_alone(self) -> None:
        assert hits("seglen:weight=0", self.T, self.CAPACITY) == [0, 0, 0, 0, 0]

    def test_replay_length_runs_to_the_nearest_state(self) -> None:
        from marconi.core.tree import RadixTree
        from marconi.peers.seglen import replay_length

        tree = RadixTree()
        a = tree.insert(tree.root, np.arange(10, dtype=np.int32).tobytes())
        b = tree.insert(a, np.arange(10, 15, dtype=np.int32).tobytes())
        c = tree.insert(b, np.arange(15, 18, dtype=np.int32).tobytes())
        a.has_state = True
        assert (replay_length(a), replay_length(b), replay_length(c)) == (10, 5, 8)
        b.has_state = True
        assert replay_length(c) == 3


class TestTailLRU:
    TLRU = "tlru:threshold=150,next_prompt_estimate=0"

    def test_tel_safe_tail_leaves_first(self) -> None:
        """Y (300 tokens) oldest; X grows to 200 tokens (100 + 100); Z needs room for one
        leaf. LRU drops Y; T-LRU drops X's last 100 tokens, which start at depth 100 >=
        200 - 150 (a next prefill of X recomputes at most 150 tokens), so Y hits."""
        y, x1, z = seq(0, 300), seq(1000, 100), seq(3000, 100)
        x2 = x1 + seq(2000, 100)
        t = trace(y, x1, x2, z, y + seq(4000, 10), x2 + seq(5000, 10),
                  sessions=["y", "x", "x", "z", "y", "x"])
        capacity = 11 * STATE + 550 * KV  # 10 state slots (and SGLang's padding slot)

        def run_hits(system: str) -> list[int]:
            config = SimConfig(spec=SMALL, capacity=capacity, system=system, bounds=False,
                               page_size=1, state_slots=10)
            return [int(h) for h in run(t, config, warn=False).records.hit]

        assert run_hits("sglang-2026") == [0, 0, 100, 0, 0, 100]
        assert run_hits(self.TLRU) == [0, 0, 100, 0, 300, 100]

    def test_trimming_stops_at_the_budget(self) -> None:
        """The high-water depth does not shrink as the tail leaves: X (400 tokens in four
        turns) loses its last 100 tokens, then no more (200 < 400 - 150); W goes next."""
        from tests.helpers import serve

        cache = get_system(self.TLRU).cache(SMALL, "10GB", page_size=1, state_slots=0)
        serve(cache, None, seq(9000, 500), 500)  # W, the oldest
        x: list[int] = []
        for turn in range(4):
            x += seq(1000 * (turn + 1), 100)
            serve(cache, None, x, len(x))

        def leaves() -> list[int]:
            return sorted(n.depth for n in cache.tree.nodes() if n.is_leaf)

        assert leaves() == [400, 500]
        cache.evict(1)
        assert leaves() == [300, 500]
        cache.evict(1)
        assert leaves() == [300]

    def test_threshold_must_exceed_the_estimate(self) -> None:
        with pytest.raises(ValueError, match="must exceed next_prompt_estimate"):
            get_system("tlru:threshold=512,next_prompt_estimate=512")


class TestLlamaCpp:
    """Session a sends P (100 tokens), then P + R, then P + S (parting from its slot's
    sequence at 100), then P + R + T; session b sends P + Q in between. Each session has
    a slot of its own: b reuses nothing of a's. a reuses its live state (100), then the
    checkpoint one token before P's end (99), and after P + S replaced P + R in the slot,
    only that checkpoint again. sglang+'s shared tree keeps every branch."""

    P = seq(0, 100)
    T = trace(P, P + seq(1000, 20), P + seq(2000, 50), P + seq(3000, 30),
              P + seq(2000, 50) + seq(4000, 20), sessions=["a", "b", "a", "a", "a"])

    def test_slots_and_checkpoints(self) -> None:
        assert hits("sglang+", self.T, 10**9) == [0, 100, 100, 100, 150]
        assert hits("llamacpp-2026", self.T, 10**9) == [0, 0, 100, 99, 99]

    def test_older_checkpoints_leave_first(self) -> None:
        """One checkpoint a slot: P + R's (149) pushed P's (99) out."""
        assert hits("llamacpp-2026:ctx_checkpoints=1", self.T, 10**9) == [0, 0, 100, 0, 0]

    def test_without_sessions_one_slot(self) -> None:
        """A driver that names no session (the engine, the server) runs one slot."""
        from tests.helpers import serve

        cache = get_system("llamacpp-2026").cache(SMALL, "1GB")
        got = [serve(cache, None, r.input_tokens, r.n_input) for r in self.T]
        assert got == [0, 100, 99, 99, 99]


class TestSparsePrefix:
    @staticmethod
    def brute(depths: list[int], survival: list[float], budget: int) -> float:
        from itertools import combinations

        best = 0.0
        for k in range(1, budget + 1):
            for chosen in combinations(range(len(depths)), k):
                got, last = 0.0, 0
                for j in chosen:
                    got += (depths[j] - last) * survival[j]
                    last = depths[j]
                best = max(best, got)
        return best

    def test_the_placement_is_exact(self) -> None:
        from marconi.peers.sparse_prefix import place

        rng = np.random.default_rng(0)
        for _ in range(300):
            n = int(rng.integers(1, 9))
            depths = sorted(int(d) for d in rng.choice(200, size=n, replace=False) + 1)
            survival = sorted((float(v) for v in rng.random(n)), reverse=True)
            budget = int(rng.integers(1, 5))
            value, chosen = place(depths, survival, budget)
            assert value == pytest.approx(self.brute(depths, survival, budget))
            assert len(chosen) <= budget and list(chosen) == sorted(chosen)
            at = {d: s for d, s in zip(depths, survival, strict=True)}
            again, last = 0.0, 0
            for c in chosen:
                again, last = again + (c - last) * at[c], c
            assert again == pytest.approx(value)

    def test_checkpoints_follow_the_overlaps_seen(self) -> None:
        """A 50-token system prompt P; every request is P + its own question. The first
        two see no overlap worth a checkpoint (none yet, then one at 0); from the third
        on half the requests before overlapped 50 tokens: a checkpoint at 50, which the
        fourth reuses. Under a budget of 1 nothing else is kept."""
        p = seq(0, 50)
        t = trace(*(p + seq(1000 * (k + 1), 30) for k in range(4)))
        assert hits("sparse-prefix:budget=1", t, 10**9) == [0, 0, 0, 50]
        assert hits("sglang+", t, 10**9) == [0, 0, 50, 50]
