"""The reference a cached run is held to: one plain transformers forward, no cache.

Nothing of marconi's is on this path: the transformers module is called directly over
the whole sequence (prompt + output) with `use_cache=False`, and the logits at every
position are compared with what the engine returned:

```
sequence: | prompt ......................... | out[0] out[1] ... out[k-1] |
logits:                          row n-1 -> out[0], row n -> out[1], ..., row n+k-2
```
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from marconi.engine import Generation, HybridModel

TOL = 1e-4  # float32, as the engine's own exactness tests


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
