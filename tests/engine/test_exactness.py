"""Cached runs give the same tokens and logits as uncached runs (float32, `TOL`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.engine.reference import TOL

from marconi.core.families import ENGINE_FAMILIES
from marconi.engines.hf import Capture, Engine, Sampling, restore, snapshot_kv, snapshot_state
from marconi.engines.hf.prefill import forward, prefill

FAMILIES = ENGINE_FAMILIES  # the registry's (core/families.py)
SYSTEMS = ["marconi", "sglang+", "vllm+", "marconi+"]
# hits of _workload (a: system 45 + 12, b: + 9, c: + 20, d: b + 7; 6 output tokens each),
# then three turns of a fresh conversation (57 tokens, + output + 5 each turn):
# judicious: b checkpoints the branch at 45, c and d resume there, turns at 63 and 74;
# block(32): every branch resumes at the block boundary 32
_JUDICIOUS = [0, 0, 45, 45, 0, 63, 74]
HITS = {"marconi": _JUDICIOUS, "sglang+": _JUDICIOUS, "marconi+": _JUDICIOUS,
        "vllm+": [0, 32, 32, 32, 0, 63, 74]}


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, n).astype(np.int32)


def _workload(rng: np.random.Generator) -> list[np.ndarray]:
    """Shared system prompt, branches off it, and a branch of a branch."""
    system = _tokens(rng, 45)
    a, b = np.concatenate([system, _tokens(rng, 12)]), np.concatenate([system, _tokens(rng, 9)])
    return [a, b, np.concatenate([system, _tokens(rng, 20)]), np.concatenate([b, _tokens(rng, 7)])]


def _check_same(cached: Engine, plain: Engine, prompt: np.ndarray, steps: int = 6,
                sampling: Sampling | None = None) -> tuple[int, np.ndarray]:
    got = cached.generate(prompt, steps, sampling)
    want = plain.generate(prompt, steps, sampling)
    np.testing.assert_array_equal(got.output, want.output)
    assert torch.allclose(got.logits, want.logits, atol=TOL, rtol=0)
    return got.hit, got.output


class TestCachedEqualsUncached:
    @pytest.mark.parametrize("arch", FAMILIES)
    @pytest.mark.parametrize("system", SYSTEMS)
    def test_shared_prefixes_and_multi_turn(self, get_model, arch, system):
        model, rng = get_model(arch), np.random.default_rng(1)
        cached, plain = Engine(model, system, alpha=0.5 if system == "marconi" else None), \
            Engine(model, "vanilla")
        hits = [_check_same(cached, plain, p)[0] for p in _workload(rng)]
        history = _workload(rng)[0]
        for _turn in range(3):  # multi-turn: each input extends the last input + output
            hit, out = _check_same(cached, plain, history)
            hits.append(hit)
            history = np.concatenate([history, out, _tokens(rng, 5)])
        assert hits == HITS[system]
        assert cached.cache.stats.states_not_captured == 0

    @pytest.mark.parametrize("arch", ["bamba", "zamba2"])
    def test_sampled_with_seed(self, get_model, arch):
        model, rng = get_model(arch), np.random.default_rng(2)
        cached, plain = Engine(model, "sglang+"), Engine(model, "vanilla")
        sampling = Sampling(temperature=0.8, top_k=50, seed=7)
        prompt = _tokens(rng, 40)
        _, out = _check_same(cached, plain, prompt, sampling=sampling)
        hit, _ = _check_same(cached, plain, np.concatenate([prompt, out, _tokens(rng, 4)]),
                             sampling=sampling)
        assert hit == len(prompt) + len(out)


class TestExactRepeat:
    @pytest.mark.parametrize("arch", FAMILIES)
    @pytest.mark.parametrize("paged", [False, True], ids=["tensor", "paged"])
    def test_repeat_of_a_cached_sequence_is_exact(self, get_model, arch, paged):
        """No prefill at all: the first token comes from the logits kept with the state."""
        model, rng = get_model(arch), np.random.default_rng(3)
        layout = {"page_size": 4, "state_slots": 4} if paged else {}
        cached, plain = Engine(model, "sglang+", **layout), Engine(model, "vanilla")
        prompt = _tokens(rng, 30)
        first = cached.generate(prompt, 5)
        repeat = np.concatenate([prompt, first.output])  # the cache holds a state at its end
        hit, _ = _check_same(cached, plain, repeat)
        assert hit == len(repeat)


class TestRestore:
    @pytest.mark.parametrize("arch", FAMILIES)
    def test_restoring_the_same_checkpoint_twice_gives_the_same_result(self, get_model, arch):
        model, rng = get_model(arch), np.random.default_rng(4)
        tokens = torch.from_numpy(_tokens(rng, 50)).long()
        done = prefill(model, tokens[:30], model.new_cache(), 0, [30])
        state, block = done.states[30], snapshot_kv(model, done.cache, 0, 30)
        runs = [forward(model, restore(model, block, state), tokens[30:], 30) for _ in range(2)]
        full = forward(model, model.new_cache(), tokens, 0)
        assert torch.equal(runs[0], runs[1])
        assert torch.allclose(runs[0], full, atol=TOL, rtol=0)

    def test_snapshot_is_a_clone(self, get_model):
        model, rng = get_model("bamba"), np.random.default_rng(5)
        tokens = torch.from_numpy(_tokens(rng, 20)).long()
        cache = model.new_cache()
        logits = forward(model, cache, tokens[:10], 0)
        state = snapshot_state(model, cache, 10, logits)
        before = [t.clone() for t in state.recurrent]
        forward(model, cache, tokens[10:], 10)  # updates the live cache in place
        assert all(torch.equal(a, b) for a, b in zip(before, state.recurrent, strict=True))


class TestChunkCapture:
    def test_chunk_state_equals_exact_state_at_the_boundary(self, get_model):
        model, rng = get_model("bamba"), np.random.default_rng(6)
        tokens = torch.from_numpy(_tokens(rng, 60)).long()
        chunk = model.chunk_size
        chunked = prefill(model, tokens, model.new_cache(), 0, [40], Capture.CHUNK)
        exact = prefill(model, tokens, model.new_cache(), 0, [(40 // chunk) * chunk])
        (pos,) = chunked.states
        assert pos == (40 // chunk) * chunk
        for a, b in zip(chunked.states[pos].recurrent, exact.states[pos].recurrent, strict=True):
            assert torch.allclose(a, b, atol=1e-5)

    def test_chunk_capture_with_a_cache_stays_exact_but_loses_branch_states(self, get_model):
        model, rng = get_model("bamba"), np.random.default_rng(7)
        cached = Engine(model, "sglang+", capture=Capture.CHUNK)
        plain = Engine(model, "vanilla")
        system = _tokens(rng, 37)  # the branch at 37 is not a chunk multiple (16)
        hits = [_check_same(cached, plain, np.concatenate([system, _tokens(rng, 10)]))[0]
                for _ in range(3)]
        # the second request's branch state lands at 32; the third resumes there and its
        # branch at 37 has no chunk boundary after the hit: one state not captured
        assert hits == [0, 0, 32]
        assert cached.cache.stats.states_not_captured == 1


class TestBoundaries:
    def test_system_prompt_hits_on_its_second_use_and_stays_exact(self, get_model):
        """marconi+'s first-boundary checkpoint, captured during a real prefill."""
        from marconi.plus.shadows import Boundaries, Expert, apply
        from marconi.plus.switchable import Mode

        model, rng = get_model("bamba"), np.random.default_rng(5)
        cached = Engine(model, "marconi+-gd")
        apply(cached.cache, Expert(Boundaries.FIRST, Mode.FLOP))
        plain = Engine(model, "vanilla")
        system = _tokens(rng, 40)
        hits = []
        for _ in range(3):
            prompt = np.concatenate([system, _tokens(rng, 10)])
            got = cached.generate(prompt, 4, boundaries=(40,))
            want = plain.generate(prompt, 4)
            np.testing.assert_array_equal(got.output, want.output)
            assert torch.allclose(got.logits, want.logits, atol=TOL, rtol=0)
            hits.append(got.hit)
        assert hits == [0, 40, 40]

    def test_overlap_expert_truncated_sequences_stay_exact(self, get_model):
        """marconi+-overlap's overlap expert: states only at the planner's positions,
        sequences kept up to the last (their KV sliced there), restored exactly."""
        from marconi.plus.shadows import Boundaries, Expert, ShadowConfig, ShadowTuner
        from marconi.plus.switchable import Mode

        model, rng = get_model("bamba"), np.random.default_rng(8)
        tuner = ShadowTuner(ShadowConfig(experts=(Expert(Boundaries.OVERLAP, Mode.FLOP),)))
        cached = Engine(model, "marconi+-overlap", tuner=tuner)
        tuner.start(cached.cache)
        plain = Engine(model, "vanilla")
        doc = _tokens(rng, 48)
        hits = []
        for depth in (24, 48, 24, 48, 24, 48):
            prompt = np.concatenate([doc[:depth], _tokens(rng, 6)])
            got = cached.generate(prompt, 4)
            want = plain.generate(prompt, 4)
            np.testing.assert_array_equal(got.output, want.output)
            assert torch.allclose(got.logits, want.logits, atol=TOL, rtol=0)
            hits.append(got.hit)
        # the third request is planned from the first two overlaps (24): its state there
        # is what the rest resume from
        assert hits == [0, 0, 0, 24, 24, 24]
        stack, leaves = list(cached.cache.tree.roots.values()), []
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            leaves += [node] if not node.children else []
        assert leaves and all(leaf.has_state for leaf in leaves)  # cut at their last state
