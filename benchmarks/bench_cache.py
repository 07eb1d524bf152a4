"""Speed of the core cache: lookup and commit on 32K-token conversations, and choosing one
FLOP-aware victim among 10^4 candidates. Prints a table; targets are in RESULTS.md.

    .venv/bin/python benchmarks/bench_cache.py [--sessions 8] [--turn-tokens 1024]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from marconi.core.spec import PAPER_7B
from marconi.paper.eviction import FlopAware
from marconi.plus.density import HitDensity
from marconi.plus.greedy_dual import GreedyDualFlop
from marconi.plus.switchable import Switchable
from marconi.systems import make_cache


def conversations(sessions: int, turn: int, max_tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Turn-by-turn inputs of `sessions` conversations growing to `max_tokens` tokens."""
    rng = np.random.default_rng(seed)
    inputs: list[list[np.ndarray]] = []
    for s in range(sessions):
        history = rng.integers(0, 32_000, max_tokens, dtype=np.int32)
        history[0] = s  # sessions differ from the first token
        inputs.append([history[:end] for end in range(turn, max_tokens + 1, turn)])
    return [turns[k] for k in range(len(inputs[0])) for turns in inputs]  # round robin


def time_requests(system: str, inputs: list[np.ndarray], out_tokens: int) -> dict[str, float]:
    cache = make_cache(PAPER_7B, "10TB", system, alpha=1.0)
    lookups, commits = [], []
    for tokens in inputs:
        t0 = time.perf_counter()
        cache.lookup(tokens)
        t1 = time.perf_counter()
        cache.commit(np.concatenate([tokens, tokens[:out_tokens]]), len(tokens))
        t2 = time.perf_counter()
        lookups.append(t1 - t0)
        commits.append(t2 - t1)
    us = 1e6
    last = [t for x, t in zip(inputs, lookups, strict=True) if len(x) == len(inputs[-1])]
    return {"lookup_p50_us": np.median(lookups) * us,
            "lookup_p95_us": np.percentile(lookups, 95) * us,
            "lookup_32k_p50_us": np.median(last) * us,
            "commit_p50_us": np.median(commits) * us,
            "commit_p95_us": np.percentile(commits, 95) * us,
            "nodes": cache.tree.size}


def time_victim(candidates: int, repeats: int = 200, system: str = "marconi") -> float:
    """Median seconds for one victim choice among `candidates` candidates (`marconi`:
    FLOP-aware; `marconi+-density`: hit density, run by its Switchable's twin;
    `marconi+`: the whole Switchable in hit-density mode, which also advances
    GreedyDual's level, a second scoring pass)."""
    cache = make_cache(PAPER_7B, "900TB", system, alpha=1.0 if system == "marconi" else None)
    rng = np.random.default_rng(1)
    for i in range(candidates):
        tokens = rng.integers(0, 32_000, int(rng.integers(10, 2000)), dtype=np.int32)
        tokens[0] = i  # distinct first tokens: one leaf each under the root
        cache.commit(tokens, len(tokens))
    policy = cache.eviction
    if system == "marconi+-density":
        assert isinstance(policy, Switchable)
        policy = policy.density
    candidates_of = policy.flop if isinstance(policy, Switchable) else policy
    assert isinstance(candidates_of, FlopAware | GreedyDualFlop | HitDensity)
    assert len(candidates_of.candidates()) == candidates
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        policy.victim((), cache.clock)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32_768)
    parser.add_argument("--candidates", type=int, default=10_000)
    args = parser.parse_args()
    inputs = conversations(args.sessions, args.turn_tokens, args.max_tokens)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python "
          f"{platform.python_version()}; {len(inputs)} requests, {args.sessions} conversations "
          f"growing by {args.turn_tokens} to {args.max_tokens} tokens")
    print(f"{'system':10} {'lookup p50':>11} {'p95':>8} {'32K p50':>9} {'commit p50':>11} "
          f"{'p95':>8} {'nodes':>7}   (microseconds)")
    for system in ("sglang+", "marconi", "vllm+"):
        r = time_requests(system, inputs, out_tokens=64)
        print(f"{system:10} {r['lookup_p50_us']:11.1f} {r['lookup_p95_us']:8.1f} "
              f"{r['lookup_32k_p50_us']:9.1f} {r['commit_p50_us']:11.1f} {r['commit_p95_us']:8.1f} "
              f"{int(r['nodes']):7d}")
    victim = time_victim(args.candidates)
    print(f"FLOP-aware victim among {args.candidates} candidates: {victim * 1e6:.1f} us median")
    victim = time_victim(args.candidates, system="marconi+-density")
    print(f"hit-density victim among {args.candidates} candidates: {victim * 1e6:.1f} us median")
    victim = time_victim(args.candidates, system="marconi+")
    print(f"marconi+ victim (hit density + GreedyDual level) among {args.candidates} "
          f"candidates: {victim * 1e6:.1f} us median")


if __name__ == "__main__":
    main()
