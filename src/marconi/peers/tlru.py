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

from collections.abc import Collection, Iterable
from dataclasses import replace

from marconi.core.books import CoreBooks
from marconi.core.policy import Action, Victim
from marconi.core.tree import Node
from marconi.peers.mamba_radix import MambaRadixLRU, SGLangConfig


def tel_safe(start: int, high: int, threshold: int, next_prompt: int) -> bool:
    """Whether a leaf whose edge starts at depth `start`, under a high-water depth
    `high`, may leave without lengthening the conversation's next prefill past
    `threshold` tokens (SGLang's `TLRUStrategy`)."""
    return start >= max(high + next_prompt - threshold, 0)


class TailLRU(MambaRadixLRU):
    """`MambaRadixLRU` whose KV list gives TEL-safe leaves first (then LRU)."""

    compiled_as = "radixtlru"  # marconi.core.compiled runs it (no cap on states per path)

    def __init__(self, config: SGLangConfig | None = None, *, threshold: int = 0,
                 next_prompt: int = 0) -> None:
        super().__init__(config)
        if threshold < 0 or next_prompt < 0:
            raise ValueError("T-LRU needs threshold >= 0 and next_prompt_estimate >= 0, "
                             f"got {threshold} and {next_prompt}")
        self.threshold, self.next_prompt = threshold, next_prompt
        self.high: dict[Node, int] = {}  # the deepest depth ever inserted at or below

    def core_books(self) -> CoreBooks:
        """The lists' books, and the KV order's threshold and next prompt."""
        return replace(super().core_books(), tlru=(self.threshold, self.next_prompt))

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        path, new = list(path), list(new)
        for node in new:  # a split's upper half inherits the branch's mark
            below = [self.high.get(c, c.depth) for c in node.children.values()]
            self.high[node] = max([node.depth, *below])
        end = path[-1].depth if path else 0
        for node in path:
            if self.high.get(node, 0) < end:
                self.high[node] = end
        super().on_commit(path, new, now)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.high.pop(node, None)

    def _safe(self, node: Node) -> bool:
        return tel_safe(node.depth - node.edge_len, self.high.get(node, node.depth),
                        self.threshold, self.next_prompt)

    def _kv_victim(self, protected: Collection[Node]) -> Victim | None:
        lru = self.kv
        best = None
        for entry in lru.heap:
            node = entry[3]
            if node not in protected and lru.valid(entry) and self._safe(node) \
                    and (best is None or entry[:3] < best[:3]):
                best = entry
        if best is None:
            return super()._kv_victim(protected)
        return Victim(best[3], Action.REMOVE)
