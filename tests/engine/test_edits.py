"""Continuations across tree edits: a sequence is resumed after a later request split its
edge, after an eviction merged its nodes, after a teacher-forced or early-stopped turn.

Each resumption restores KV joined from several edges (docs/architecture.md, "Tree" and
"Eviction"), so a slice or join off by one token, or in the wrong order, changes the
logits; every request is held to one plain uncached forward (tests/engine/reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.engine.reference import assert_matches_reference, stop_after

from marconi.core.families import ENGINE_FAMILIES
from marconi.core.integrity import check_integrity
from marconi.engines.hf import Engine, Generation

FAMILIES = ENGINE_FAMILIES  # the registry's (core/families.py)


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, n).astype(np.int32)


def _exact(engine: Engine, prompt: np.ndarray, steps: int = 4, **kwargs: object) -> Generation:
    got = engine.generate(prompt, steps, **kwargs)  # type: ignore[arg-type]
    assert_matches_reference(engine.model, prompt, got, greedy="output" not in kwargs)
    return got


class TestSplitEdge:
    @pytest.mark.parametrize("arch", FAMILIES)
    def test_continuing_a_sequence_whose_edge_a_later_request_split(self, get_model, arch):
        engine, rng = Engine(get_model(arch), "sglang+"), np.random.default_rng(11)
        prompt = _tokens(rng, 40)
        first = _exact(engine, prompt)  # one edge [0, 44) with a state at its end
        branch = _exact(engine, np.concatenate([prompt[:20], _tokens(rng, 10)]))
        assert branch.admitted == (20, 34)  # the edge was split at 20
        resumed = np.concatenate([prompt, first.output, _tokens(rng, 6)])
        got = _exact(engine, resumed)
        assert got.hit == 44  # KV joined from the split edge's head [0, 20) and tail [20, 44)
        node = engine.cache.lookup(resumed).node
        assert node is not None and [n.depth for n in engine.cache.path(node)] == [20, 44]
        check_integrity(engine.cache)


class TestMergedNodes:
    @pytest.mark.parametrize("arch", ["bamba", "qwen3_next"])
    def test_a_merged_edge_splits_at_the_right_token(self, get_model, arch):
        """Attention does not see the order of cached KV, so a merge that joins its two
        edges the wrong way round shows only once the merged edge is split again."""
        engine = Engine(get_model(arch), "marconi", alpha=0.0)
        rng = np.random.default_rng(12)
        prompt = _tokens(rng, 30)
        first = _exact(engine, prompt)  # node [0, 34)
        second = _exact(engine, np.concatenate([prompt, first.output, _tokens(rng, 10)]))
        assert second.hit == 34  # a child [34, 48) under it
        engine.cache.evict(1)  # the older node (the parent, one child) merges into its child
        (node,) = engine.cache.tree.root.children.values()
        assert node.depth == 48 and node.kv.tokens == 48 and engine.cache.stats.evictions == 1
        branch = np.concatenate([prompt[:20], _tokens(rng, 8)])
        assert _exact(engine, branch).admitted == (20, 32)  # splits the merged edge at 20
        got = _exact(engine, np.concatenate([prompt[:20], _tokens(rng, 5)]))
        assert got.hit == 20  # the head [0, 20) of the merged edge
        check_integrity(engine.cache)


class TestOutputs:
    @pytest.mark.parametrize("arch", ["bamba", "zamba2"])
    def test_a_forced_output_that_leaves_an_earlier_one_is_resumable(self, get_model, arch):
        engine, rng = Engine(get_model(arch), "sglang+"), np.random.default_rng(13)
        prompt = _tokens(rng, 30)
        first = _exact(engine, prompt, 6)
        forced = np.concatenate([first.output[:3], _tokens(rng, 4)])  # leaves it at 33
        got = _exact(engine, prompt, output=forced)
        assert got.hit == 0  # the prompt ends inside the first edge: no state there
        assert got.admitted == (33, 37)  # the branch inside the output and the end
        for end in (33, 37):
            resumed = np.concatenate([prompt, forced[: end - 30], _tokens(rng, 3)])
            assert _exact(engine, resumed).hit == end

    def test_an_early_stop_is_committed_where_it_stopped(self, get_model):
        engine, rng = Engine(get_model("bamba"), "sglang+"), np.random.default_rng(14)
        prompt = _tokens(rng, 25)
        got = _exact(engine, prompt, 8, on_token=stop_after(2))
        assert len(got.output) == 2 and got.admitted == (27,)
        resumed = np.concatenate([prompt, got.output, _tokens(rng, 4)])
        assert _exact(engine, resumed).hit == 27
