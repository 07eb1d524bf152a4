"""Engine fuzz: every family on both stores and in both capture modes, a capacity tight
enough to evict, merge, split and refuse, every request held to one plain uncached
forward (tests/engine/reference.py), logits and stored tensors alike.

Each case runs 30 seeded requests (tests/engine/workload.py: new prompts, shared system
prompts, next turns, branches inside earlier prompts and outputs, exact repeats of a
prompt and of a prompt plus its output, sequences too long to keep; some teacher-forced,
some stopped early) under one registered system, so that every system the engine can
run is exercised under pressure. After every request, every K/V block and state the
cache holds equals an uncached forward's (`check_stored`). In exact-capture mode no state
the cache admitted went uncaptured, and the hits equal those of a token-only twin cache
of the same system and layout fed the same sequences: the engine supplies every state
the cache asks for and reuses exactly what the core planned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from tests.engine.reference import assert_matches_reference, check_stored, stop_after
from tests.engine.test_store import check_bytes
from tests.engine.workload import Mix, Request

from marconi.core.integrity import check_integrity
from marconi.engines.hf import Capture, Engine, Generation, HybridModel, PagedStore
from marconi.systems import get_system

REQUESTS = 30
E, C = Capture.EXACT, Capture.CHUNK


@dataclass(frozen=True, slots=True)
class Case:
    arch: str
    capture: Capture
    system: str
    paged: bool  # a page pool and a state-slot pool (the system's own, else `PAGED`)

    @property
    def id(self) -> str:
        store = "paged" if self.paged else "tensor"
        return f"{self.arch}-{self.capture.value}-{self.system}-{store}"


PAGED = {"page_size": 4, "state_slots": 4}  # mid-page splits, copies at seams, few slots
TENSOR = {"page_size": 1, "state_slots": 0}  # one byte budget: the `TensorStore`
OWN_LAYOUT = ("sglang-2026", "vllm-2026")  # paged by their engines' own layouts
# qwen3_next has no chunked scan, so no chunk-capture case
CASES = [Case(*c) for c in (
    ("bamba", E, "marconi", False), ("bamba", C, "vllm+", False),
    ("bamba", E, "marconi+", True), ("bamba", C, "sglang-2026", True),
    ("nemotron_h", E, "sglang+", False), ("nemotron_h", C, "marconi", False),
    ("nemotron_h", E, "vllm-2026", True), ("nemotron_h", C, "marconi+", True),
    ("granitemoehybrid", E, "vllm+", False), ("granitemoehybrid", C, "marconi+", False),
    ("granitemoehybrid", E, "marconi", True), ("granitemoehybrid", C, "sglang+", True),
    ("falcon_h1", E, "marconi-inverse-age", False), ("falcon_h1", C, "vllm+", False),
    ("falcon_h1", E, "sglang-2026", True), ("falcon_h1", C, "marconi", True),
    ("zamba2", E, "marconi+", False), ("zamba2", C, "marconi-inverse-age", False),
    ("zamba2", E, "marconi", True), ("zamba2", C, "vllm-2026", True),
    ("qwen3_next", E, "marconi-inverse-age", False), ("qwen3_next", E, "marconi+", True),
    ("qwen3_next", E, "vllm-2026", True),
)]
MERGING = ("marconi", "marconi+", "marconi-inverse-age")  # evict inner states: merges
FIXED_ALPHA = {"marconi": 1.0, "marconi-inverse-age": 1.0}  # the bootstrap tuner forks


def capacity(model: HybridModel, states: int = 3, tokens: int = 150) -> int:
    """Room for `states` checkpoints (each with its float32 logits) and `tokens` of KV."""
    state = model.spec.ssm_bytes + 4 * model.vocab_size
    return states * state + tokens * model.spec.kv_bytes_per_token


def layout(case: Case) -> dict[str, Any]:
    """The layout knobs the case's engine (and its twin) get; {}: the system's own."""
    if case.system in OWN_LAYOUT:
        return {}
    return PAGED if case.paged else TENSOR


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
    """A token-only cache of the same system and layout fed the same sequences, driven as
    the engine drives its cache: the hit node stays pinned through the commit."""

    def __init__(self, engine: Engine, system: str, alpha: float | None,
                 knobs: dict[str, Any]) -> None:
        named = get_system(system)
        self.cache = named.cache(engine.cache.spec, engine.cache.capacity, alpha=alpha,
                                 **knobs)
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


def _count(store: object, name: str, seen: Counter[str]) -> None:
    """Count the store's `name` calls (splits, joins) without changing what they do."""
    method: Callable[..., Any] = getattr(store, name)

    def counted(*args: Any) -> Any:
        seen[name] += 1
        return method(*args)

    setattr(store, name, counted)


def run_case(model: HybridModel, case: Case, seed: int) -> tuple[Engine, Counter[str]]:
    alpha = FIXED_ALPHA.get(case.system)
    # SGLang's pool is carved at 0.9 / 1.9 of the memory, less a padding slot: room for 6
    # states leaves it the 2 a request admits; a paged case gets room for 4 (`PAGED`: 4 slots)
    states = 6 if case.system.startswith("sglang-2026") else 4 if case.paged else 3
    room = capacity(model, states=states)
    knobs = layout(case)
    engine = Engine(model, case.system, room, capture=case.capture, alpha=alpha, **knobs)
    assert isinstance(engine.store, PagedStore) == case.paged, case
    seen: Counter[str] = Counter()
    for name in ("kv_split", "kv_join"):
        _count(engine.store, name, seen)
    twin = Twin(engine, case.system, alpha, knobs) if case.capture is Capture.EXACT else None
    mix = Mix(seed, long_len=room // model.spec.kv_bytes_per_token + 5)
    for i in range(REQUESTS):
        request = mix.next()
        seen[request.kind] += 1
        before = engine.cache.stats.copy()
        got = _serve(engine, request)
        _check(engine, request, got)
        seen["states checked"] += check_stored(engine)
        stats = engine.cache.stats
        if stats.refused_commits > before.refused_commits:  # bypassed: nothing evicted
            assert (stats.evictions, stats.bytes) == (before.evictions, before.bytes), i
        if twin is not None:
            assert got.hit == twin.serve(request.prompt, got.output), f"request {i}"
        mix.done(request.prompt, got.output, request.kind)
    return engine, seen


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cached_runs_equal_a_plain_forward_under_pressure(get_model, case):
    engine, seen = run_case(get_model(case.arch), case, seed=CASES.index(case))
    stats = engine.cache.stats
    assert stats.evictions > 0 and stats.refused_commits > 0, stats
    assert stats.hit_requests >= 5, stats
    assert seen["kv_split"] > 0, seen
    if case.system in MERGING:
        assert seen["kv_join"] > 0, seen
    assert seen["states checked"] > 0, seen
    if case.capture is Capture.EXACT:
        assert stats.states_not_captured == 0, stats
    assert engine.cache.bytes <= engine.cache.capacity
    check_integrity(engine.cache)
    check_bytes(engine)


def test_the_cases_cover_every_family_store_and_capture():
    """Every family on both stores, each store with a system that merges; every family
    with a chunked scan in both modes."""
    from marconi.core.families import FAMILIES

    engine_facts = {arch: f.engine for arch, f in FAMILIES.items() if f.engine is not None}
    assert {c.arch for c in CASES} == set(engine_facts), "cases for engine families only"
    for arch, facts in engine_facts.items():
        mine = [c for c in CASES if c.arch == arch]
        assert {c.paged for c in mine} == {False, True}, arch
        assert {c.paged for c in mine if c.system in MERGING} == {False, True}, arch
        want = {E, C} if facts.chunk_key else {E}
        assert {c.capture for c in mine} == want, arch
