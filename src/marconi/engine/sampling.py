"""Choosing the next token: greedy, or sampled reproducibly from a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """Sampling settings; the default (temperature 0) is greedy."""

    temperature: float = 0.0  # 0: argmax; otherwise softmax(logits / temperature)
    top_k: int | None = None  # keep only the k most likely tokens; None: all
    seed: int = 0  # step i draws from a generator seeded with (seed, i): cache-independent

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")


def sample(logits: torch.Tensor, sampling: Sampling | None, step: int) -> int:
    """The token chosen from `logits` (vocab,) at output step `step`."""
    if sampling is None or sampling.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scaled.numel():
        cutoff = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < cutoff, float("-inf"))
    generator = torch.Generator().manual_seed(sampling.seed * 1_000_003 + step)
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))
