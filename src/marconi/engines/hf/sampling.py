"""Choosing the next token: greedy, or sampled reproducibly from a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SEED_SPACE = 2**64  # torch generators take a 64-bit seed; a wider one wraps around


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """Sampling settings; the default (temperature 0) is greedy."""

    temperature: float = 0.0  # 0: argmax; otherwise softmax(logits / temperature)
    top_k: int | None = None  # keep only the k most likely tokens; None: all
    top_p: float = 1.0  # keep the fewest most likely tokens holding this mass; 1: all
    seed: int = 0  # step i draws from a generator seeded with (seed, i): cache-independent

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")


def sample(logits: torch.Tensor, sampling: Sampling | None, step: int) -> int:
    """The token chosen from `logits` (vocab,) at output step `step`."""
    if sampling is None or sampling.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / sampling.temperature
    if not torch.isfinite(scaled.max()):
        # a temperature so small that logits / temperature overflow (or one that is 0 in
        # float32): softmax is then one-hot on the argmax, the limit as temperature -> 0
        return int(torch.argmax(logits))
    if sampling.top_k is not None and sampling.top_k < scaled.numel():
        cutoff = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < cutoff, float("-inf"))
    if sampling.top_p < 1:
        scaled = _nucleus(scaled, sampling.top_p)
    generator = torch.Generator().manual_seed((sampling.seed * 1_000_003 + step) % SEED_SPACE)
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))


def _nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scaled` with every token outside the top-p nucleus masked out: tokens are kept in
    order of probability until the ones before them hold `top_p` (the first always is)."""
    probs, order = torch.sort(torch.softmax(scaled, dim=-1), descending=True)
    before = torch.cumsum(probs, dim=0) - probs
    # compared in float32, a top_p below its smallest number (1e-46) is 0, which every
    # `before` reaches, the first's too: it is kept by position, never by the comparison
    # (masking every token would make softmax NaN and multinomial fail)
    outside = before >= top_p
    outside[0] = False
    return scaled.index_fill(0, order[outside], float("-inf"))
