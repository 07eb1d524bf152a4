"""The reference a cached run is held to: one plain transformers forward, no cache.

Logits: nothing of marconi's is on this path: the transformers module is called directly
over the whole sequence (prompt + output) with `use_cache=False`, and the logits at every
position are compared with what the engine returned:

```
sequence: | prompt ......................... | out[0] out[1] ... out[k-1] |
logits:                          row n-1 -> out[0], row n -> out[1], ..., row n+k-2
```
States (`check_stored`): what the cache holds, compared tensor by tensor with one
uncached forward over each stored prefix: every edge's K/V, every checkpoint's conv and
recurrent state and the next-token logits kept beside it. Logits alone cannot show every
state bug (a state read out a token late, a KV range joined in the wrong order where the
attention barely looks): the tensors can.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from marconi.engines.hf import Engine, Generation, HybridModel
from marconi.engines.hf.prefill import prefill
from marconi.engines.hf.state import snapshot_kv

# float32, as the engine's own exactness tests: cached and uncached logits agree to
# ~1e-6 on the tiny models (measured: at most 1.1e-6, qwen3_next), where a wrong state
# moves them by >= 1e-2 (tests/engine/test_models.py)
TOL = 1e-5
STATE_TOL = 1e-5  # stored tensors against an uncached forward's, relative to their scale


def reference_logits(model: HybridModel, tokens: np.ndarray) -> torch.Tensor:
    """(len(tokens), vocab) logits of one uncached forward of the transformers module."""
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))[None]
    with torch.inference_mode():
        return model.module(input_ids=ids, use_cache=False).logits[0].float()


def assert_matches_reference(model: HybridModel, prompt: np.ndarray, got: Generation,
                             greedy: bool = True) -> None:
    """The engine's logits (one row per output token it chose, or one row for a forced
    output) equal the reference's at the same positions; greedy tokens are their argmax."""
    n, out = len(prompt), np.asarray(got.output)
    ref = reference_logits(model, np.concatenate([prompt, out])[:-1])
    want = ref[n - 1 : n - 1 + got.logits.shape[0]]
    assert got.logits.shape == want.shape, (got.logits.shape, want.shape)
    err = float((got.logits - want).abs().max())
    assert err <= TOL, f"logits differ from the uncached forward by {err:.2e}"
    if greedy:
        np.testing.assert_array_equal(out, want.argmax(-1).numpy())


def stop_after(k: int) -> Callable[[int], bool]:
    """An `on_token` that stops decoding after the k-th token."""
    seen: list[int] = []

    def on_token(token: int) -> bool:
        seen.append(token)
        return len(seen) < k

    return on_token


def _close(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= STATE_TOL * scale, f"{what} differs from an uncached forward's by {err:.2e}"


def check_stored(engine: Engine) -> int:
    """Every edge's K/V and every stored state (conv, recurrent, the logits beside it)
    equal those of one uncached forward over the node's whole prefix; the number of
    states checked. Works on either store (through its `gather` / `state`)."""
    model, cache, store = engine.model, engine.cache, engine.store
    checked = 0
    for node in cache.tree.nodes():
        path = cache.path(node)
        tokens = torch.from_numpy(np.concatenate([n.tokens() for n in path])).long()
        ref = prefill(model, tokens, model.new_cache(), 0, [node.depth])
        want_kv = snapshot_kv(model, ref.cache, node.depth - node.edge_len, node.depth)
        got_kv = store.gather([node.kv])
        assert got_kv is not None, f"{node!r} holds no K/V"
        for layer, (gk, wk, gv, wv) in enumerate(zip(got_kv.keys, want_kv.keys, got_kv.values,
                                                      want_kv.values, strict=True)):
            _close(f"{node!r} keys of attention layer {layer}", gk, wk)
            _close(f"{node!r} values of attention layer {layer}", gv, wv)
        if not node.has_state:
            continue
        got, want = store.state(node.state), ref.states[node.depth]
        assert got.position == node.depth, f"{node!r} holds a state at {got.position}"
        for layer, (gc, wc) in enumerate(zip(got.conv, want.conv, strict=True)):
            _close(f"{node!r} conv state of SSM layer {layer}", gc, wc)
        for layer, (gr, wr) in enumerate(zip(got.recurrent, want.recurrent, strict=True)):
            _close(f"{node!r} recurrent state of SSM layer {layer}", gr, wr)
        _close(f"{node!r} logits kept with its state", got.logits, want.logits)
        checked += 1
    return checked
