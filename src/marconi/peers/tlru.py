"""Tail-optimized LRU (T-LRU; Zhang et al., arXiv 2510.15152), as SGLang 0.5.23 runs it
with `--radix-eviction-policy tlru` (docs/peers.md, "Other baselines").

A conversation that reached `H` tokens and whose next prompt adds about `Q` tokens
(`next_prompt_estimate`) keeps its next prefill within the TTFT budget of `T` tokens
(`threshold`) as long as its first `H + Q - T` tokens stay cached: the KV past that
depth cannot help the tail latency, so it is "TEL-safe" and leaves first. SGLang's
rule, per KV leaf: safe when the depth its edge starts at is at least
`max(H + Q - T, 0)`, `H` being the high-water depth ever inserted below the node (it
does not shrink as the tail is evicted, so a trimmed conversation stops being trimmed
after `T - Q` tokens). Safe leaves go first, least recently used first; then plain LRU.

SGLang applies the strategy to its KV leaves only; its Mamba state list stays LRU. So
does this: `MambaRadixLRU` (the `sglang-2026` emulation) with the KV victim chosen by
T-LRU.
"""

from __future__ import annotations

from dataclasses import replace

from marconi.core.priority import TailSafe
from marconi.peers.mamba_radix import MambaRadixLRU, SGLangConfig


class TailLRU(MambaRadixLRU):
    """`MambaRadixLRU` whose KV list gives TEL-safe leaves first (then LRU): SGLang's
    lists declared with `tail_safe` (`core.priority.TailSafe`)."""

    compiled_as = "radixtlru"  # marconi.core.compiled runs it (no cap on states per path)

    def __init__(self, config: SGLangConfig | None = None, *, threshold: int = 0,
                 next_prompt: int = 0) -> None:
        self.LISTS = replace(MambaRadixLRU.LISTS, tail_safe=TailSafe(threshold, next_prompt))
        super().__init__(config)
        self.threshold, self.next_prompt = threshold, next_prompt
