"""Checkpointed prefill: run tokens through the model, capturing SSM states on the way.

An SSM state exists only after the last token fed, so a checkpoint at position `p` means
stopping the forward at `p`. Two ways, the paper's two mechanisms:

- `Capture.EXACT` (segment method, a.k.a. two-pass): split the prefill at every
  planned position; each state lands exactly where the cache asked.
- `Capture.CHUNK` (chunk-boundary capture): a chunked SSD scan already materializes the
  state at every chunk boundary; transformers' scan does not expose them, so this is
  emulated by splitting only at chunk multiples. The state taken for `p` is the one at
  the last boundary `<= p`, up to `chunk - 1` tokens early; the cache admits it where it
  lies, so a later hit reuses up to `chunk - 1` tokens less. The end of the prefill is
  always exact.

```
| restored (start) | segment | segment ......... | segment |
0                start       p1                  p2       len(tokens)
```
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import torch
from transformers import DynamicCache

from marconi.engines.hf.models import HybridModel
from marconi.engines.hf.state import SSMState, snapshot_state


class Capture(Enum):
    """How prefill captures a state at a planned position."""

    EXACT = "exact"  # split the forward at the position itself
    CHUNK = "chunk"  # take the last scan-chunk boundary at or before it


def capture_points(positions: Iterable[int], start: int, end: int, mode: Capture,
                   chunk: int | None) -> tuple[int, ...]:
    """Where the forward is cut, in (start, end], ascending.

    Positions outside (start, end] are ignored; in chunk mode each moves down to a chunk
    multiple and is dropped when that lands at or before `start`.
    """
    points = set()
    for p in positions:
        if not start < p <= end:
            continue
        if mode is Capture.CHUNK and p != end:
            if chunk is None:
                raise ValueError("chunk-boundary capture needs a model with a chunked scan")
            p = (p // chunk) * chunk
        if p > start:
            points.add(p)
    return tuple(sorted(points))


def forward(model: HybridModel, cache: DynamicCache, tokens: torch.Tensor,
            start: int) -> torch.Tensor:
    """Feed `tokens` (1-D) at positions start.. into `cache`; the last token's logits.

    `position_ids` are always passed: some families (Bamba) ignore the cache offset.
    """
    stop = start + int(tokens.shape[0])
    with torch.inference_mode():
        out = model.module(input_ids=tokens[None], cache=cache, use_cache=True,
                           position_ids=torch.arange(start, stop)[None], logits_to_keep=1)
    return out.logits[0, -1].float()


@dataclass(slots=True)
class PrefillResult:
    """The live cache after the prefill, the last logits, and the states captured."""

    cache: DynamicCache
    logits: torch.Tensor  # next-token logits after the last token
    states: dict[int, SSMState] = field(default_factory=dict)  # by the position they hold
    forward_s: float = 0.0  # model time
    segments: int = 0  # forward calls: one more per capture point inside the range
    snapshot_s: float = 0.0  # cloning states out


def prefill(model: HybridModel, tokens: torch.Tensor, cache: DynamicCache, start: int,
            capture: Iterable[int] = (), mode: Capture = Capture.EXACT) -> PrefillResult:
    """Prefill `tokens[start:]` into `cache` (which holds the first `start` tokens).

    Mutates `cache`. Captures a state at each of `capture` (see `capture_points`); the
    caller decides whether the end state is wanted by listing `len(tokens)`.
    """
    end = int(tokens.shape[0])
    if not 0 <= start < end:
        raise ValueError(f"prefill from {start} of {end} tokens: nothing to compute")
    cuts = capture_points(capture, start, end, mode, model.chunk_size)
    result = PrefillResult(cache, torch.empty(0))
    for stop in [*[c for c in cuts if c < end], end]:
        t0 = time.perf_counter()
        result.logits = forward(model, cache, tokens[start:stop], start)
        t1 = time.perf_counter()
        if stop in cuts:
            result.states[stop] = snapshot_state(model, cache, stop, result.logits)
        result.forward_s += t1 - t0
        result.segments += 1
        result.snapshot_s += time.perf_counter() - t1
        start = stop
    return result
