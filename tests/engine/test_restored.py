"""What a hit restores equals an uncached prefill of the same prefix, tensor by tensor:
every attention layer's K/V over the whole path (the edges gathered in order), every SSM
layer's conv and recurrent state, on both stores and in both capture modes.

Logits cannot show every such bug: attention is blind to the order of cached K/V (their
positions are baked in), so a path gathered in the wrong order, or a page another edge
overwrote, can leave the logits exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.engine.reference import STATE_TOL

from marconi.core.families import FAMILIES
from marconi.engines.hf import Capture, Engine, HybridModel
from marconi.engines.hf.prefill import prefill

CASES = [(arch, capture, paged) for arch, family in sorted(FAMILIES.items())
         if family.engine is not None
         for capture in ((Capture.EXACT, Capture.CHUNK) if family.engine.chunk_key else
                         (Capture.EXACT,))
         for paged in (False, True)]


def _close(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{what}: {tuple(got.shape)} != {tuple(want.shape)}"
    err = float((got - want).abs().max())
    assert err <= STATE_TOL * max(1.0, float(want.abs().max())), f"{what}: off by {err:.2e}"


def _serve(engine: Engine, rng: np.random.Generator) -> None:
    """Branches off a shared prompt, a branch of a branch and turns: paths of 2-4 edges;
    a capacity that evicts (merges, page copies and releases)."""
    system = rng.integers(0, 256, 37)
    history = np.concatenate([system, rng.integers(0, 256, 9)])
    for i in range(6):
        engine.generate(np.concatenate([system, rng.integers(0, 256, 5 + i)]), 3)
        out = engine.generate(history, 3).output
        history = np.concatenate([history, out, rng.integers(0, 256, 4)])


def check_restored(engine: Engine) -> int:
    """Every node with a state, restored as the engine restores a hit, against a fresh
    uncached prefill of its prefix; the number checked."""
    model, checked = engine.model, 0
    for node in engine.cache.tree.nodes():
        if not node.has_state:
            continue
        path = engine.cache.path(node)
        tokens = torch.from_numpy(np.concatenate([n.tokens() for n in path])).long()
        want = prefill(model, tokens, model.new_cache(), 0).cache
        got, state = engine.restored(node)
        assert state is not None and state.position == node.depth
        for i in model.attention_layers:
            g, w = got.layers[i], want.layers[i]
            _close(f"{node!r} keys of layer {i}", g.keys, w.keys)
            _close(f"{node!r} values of layer {i}", g.values, w.values)
        for i in model.ssm_layers:
            g, w = got.layers[i], want.layers[i]
            _close(f"{node!r} conv state of layer {i}", g.conv_states[0], w.conv_states[0])
            _close(f"{node!r} recurrent state of layer {i}", g.recurrent_states[0],
                   w.recurrent_states[0])
        checked += 1
    return checked


def _capacity(model: HybridModel) -> int:
    state = model.spec.ssm_bytes + 4 * model.vocab_size
    return 4 * state + 160 * model.spec.kv_bytes_per_token


@pytest.mark.parametrize(("arch", "capture", "paged"), CASES,
                         ids=[f"{a}-{c.value}-{'paged' if p else 'tensor'}" for a, c, p in CASES])
def test_a_restored_hit_equals_an_uncached_prefill(get_model, arch, capture, paged):
    model = get_model(arch)
    layout = {"page_size": 4, "state_slots": 4} if paged else {}
    engine = Engine(model, "marconi", _capacity(model), capture=capture, alpha=1.0, **layout)
    _serve(engine, np.random.default_rng(len(arch)))
    assert engine.cache.stats.evictions > 0
    deepest = max((len(engine.cache.path(n)) for n in engine.cache.tree.nodes()
                   if n.has_state), default=0)
    assert deepest >= 2, "no state behind a path of two edges or more"
    assert check_restored(engine) >= 2
