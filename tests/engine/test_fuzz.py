"""Engine fuzz: every family, both capture modes, a capacity tight enough to evict and
refuse, every request held to one plain uncached forward (tests/engine/reference.py).

Each case runs 30 seeded requests (tests/engine/workload.py: new prompts, next turns,
branches inside earlier prompts and outputs, exact repeats, sequences too long to
keep; some teacher-forced, some stopped early) under one registered system, so that every
system the engine can run is exercised under pressure. In exact-capture mode the hits
must also equal those of a token-only twin cache of the same system fed the same
sequences: the engine supplies every state the cache asks for.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.engine.reference import assert_matches_reference, stop_after
from tests.engine.test_store import check_bytes
from tests.engine.workload import Mix, Request

from marconi.core.integrity import check_integrity
from marconi.engine import Capture, Engine, Generation, HybridModel
from marconi.systems import get_system

REQUESTS = 30
# (family, capture, system); qwen3_next has no chunked scan, so no chunk-capture case
CASES = [
    ("bamba", Capture.EXACT, "marconi"), ("bamba", Capture.CHUNK, "sglang-2026"),
    ("nemotron_h", Capture.EXACT, "sglang+"), ("nemotron_h", Capture.CHUNK, "marconi"),
    ("granitemoehybrid", Capture.EXACT, "vllm+"), ("granitemoehybrid", Capture.CHUNK, "marconi+"),
    ("falcon_h1", Capture.EXACT, "vllm-2026"), ("falcon_h1", Capture.CHUNK, "vllm+"),
    ("zamba2", Capture.EXACT, "marconi+"), ("zamba2", Capture.CHUNK, "marconi-inverse-age"),
    ("qwen3_next", Capture.EXACT, "marconi-inverse-age"),
]
FIXED_ALPHA = {"marconi": 1.0, "marconi-inverse-age": 1.0}  # the bootstrap tuner forks


def capacity(model: HybridModel, states: int = 3, tokens: int = 150) -> int:
    """Room for `states` checkpoints (each with its float32 logits) and `tokens` of KV."""
    state = model.spec.ssm_bytes + 4 * model.vocab_size
    return states * state + tokens * model.spec.kv_bytes_per_token


def _serve(engine: Engine, request: Request) -> Generation:
    on_token = stop_after(request.stop) if request.stop is not None else None
    return engine.generate(request.prompt, request.steps, output=request.forced,
                           on_token=on_token)


def _check(engine: Engine, request: Request, got: Generation) -> None:
    assert_matches_reference(engine.model, request.prompt, got, greedy=request.forced is None)
    if request.forced is not None:
        np.testing.assert_array_equal(got.output, request.forced)
    else:
        assert len(got.output) == (request.stop or request.steps)


class Twin:
    """A token-only cache of the same system fed the same sequences, driven as the engine
    drives its cache: the hit node stays pinned through the commit."""

    def __init__(self, engine: Engine, system: str, alpha: float | None) -> None:
        named = get_system(system)
        self.cache = named.cache(engine.cache.spec, engine.cache.capacity, alpha=alpha)
        self.tuner = named.make_tuner(alpha)

    def serve(self, prompt: np.ndarray, output: np.ndarray) -> int:
        full = np.concatenate([prompt, output])
        plan = self.cache.lookup(prompt)
        self.cache.pin(plan.node)
        self.cache.commit(full, len(prompt))
        self.cache.unpin(plan.node)
        if self.tuner is not None:
            self.tuner.observe(self.cache, full, len(prompt), ())
        return plan.hit


def _run_case(model: HybridModel, capture: Capture, system: str, seed: int) -> Engine:
    alpha = FIXED_ALPHA.get(system)
    # SGLang's pool is carved at 0.9 / 1.9 of the memory, less a padding slot: room for 6
    # states leaves it the 2 a request admits
    room = capacity(model, states=6 if system.startswith("sglang-2026") else 3)
    engine = Engine(model, system, room, capture=capture, alpha=alpha)
    twin = Twin(engine, system, alpha) if capture is Capture.EXACT else None
    mix = Mix(seed, long_len=room // model.spec.kv_bytes_per_token + 5)
    for i in range(REQUESTS):
        request = mix.next()
        before = engine.cache.stats.copy()
        got = _serve(engine, request)
        _check(engine, request, got)
        stats = engine.cache.stats
        if stats.refused_commits > before.refused_commits:  # bypassed: nothing evicted
            assert (stats.evictions, stats.bytes) == (before.evictions, before.bytes), i
        if twin is not None:
            assert got.hit == twin.serve(request.prompt, got.output), f"request {i}"
        mix.done(request.prompt, got.output, request.kind)
    return engine


@pytest.mark.parametrize(("arch", "capture", "system"), CASES,
                         ids=[f"{a}-{c.value}-{s}" for a, c, s in CASES])
def test_cached_runs_equal_a_plain_forward_under_pressure(get_model, arch, capture, system):
    engine = _run_case(get_model(arch), capture, system, seed=len(arch))
    stats = engine.cache.stats
    assert stats.evictions > 0 and stats.refused_commits > 0
    assert stats.hit_requests >= 5
    assert engine.cache.bytes <= engine.cache.capacity
    check_integrity(engine.cache)
    check_bytes(engine)
