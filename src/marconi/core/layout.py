"""Memory layouts: how a `PrefixCache` counts KV and SSM states against its memory
(docs/architecture.md, "Layouts").

- **Byte budget** (the default, the paper's): KV at `kv_bytes_per_token` per token and each
  state at `ssm_bytes`, both against one capacity.
- **Pages** (`page_size=P`): KV is held in whole pages of P tokens, page k holding positions
  [kP, (k+1)P) of its sequence. A node's edge [s, e) owns the pages that start inside it;
  the page it starts in began in its parent and is shared with it, unless the node was hung
  there as a new branch, which holds its own copy (its tokens past `s` differ from the
  parent's other continuations). A split inside a page shares that page between head and
  tail; merging a node into a child that holds a copy frees the copy.
- **State slots** (`state_slots=S`): a pool of S states carved out of the capacity
  (`S x ssm_bytes`), KV paged or not in the rest; at most S states are held.

```
P = 4     | 0 1 2 3 | 4 5 6 7 | 8 9 . . |
a [0, 6)    owns pages 0 and 4 (page 4 half used)
b [6, 10)   a's tail after a split at 6: owns page 8, shares page 4 with a
c [6, 7)    a new branch at 6: owns a copy of page 4 (tokens 4, 5 as in a, then its 6)
```
With P = 1 and no slots every formula here reduces to the byte budget's.
"""

from __future__ import annotations

from dataclasses import dataclass

from marconi.core.spec import ModelSpec
from marconi.core.tree import TOKEN_BYTES, Match, Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Where a cache's KV and states live; `Layout()` is the single byte budget."""

    page_size: int = 1  # tokens per KV page; 1: KV counted per token (the paper's)
    state_slots: int = 0  # states in a pool of their own; 0: they share the byte budget

    def __post_init__(self) -> None:
        for name, low in (("page_size", 1), ("state_slots", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def in_words(self) -> str:
        """For a run's report: 'KV in pages of 80 tokens, one byte budget'."""
        kv = "KV per token" if self.page_size == 1 else f"KV in pages of {self.page_size} tokens"
        states = (f"{self.state_slots} state slots beside it" if self.pooled
                  else "one byte budget")
        return f"{kv}, {states}"

    @property
    def pooled(self) -> bool:
        """States have a pool of their own (and a count limit)."""
        return self.state_slots > 0

    def starts(self, start: int, stop: int) -> int:
        """Pages whose first position lies in [start, stop)."""
        p = self.page_size
        return -(-stop // p) - -(-start // p)

    def kv_capacity(self, spec: ModelSpec, capacity: int) -> int:
        """Bytes left for KV once the state pool is carved out of `capacity` (all of it
        without a pool); ValueError when the pool alone exceeds the capacity."""
        pool = self.state_slots * spec.ssm_bytes
        if pool > capacity:
            raise ValueError(f"state_slots={self.state_slots} x {spec.ssm_bytes} bytes per "
                             f"state = {pool} bytes exceeds capacity {capacity}")
        return capacity - pool

    def describe(self) -> str:
        """`page 16, 120 state slots`, or `byte budget` (labels in tables)."""
        parts = [f"page {self.page_size}"] if self.page_size > 1 else []
        parts += [f"{self.state_slots} state slots"] if self.pooled else []
        return ", ".join(parts) or "byte budget"


class PageBooks:
    """Which nodes of one cache hold their own copy of the page they start in, and the KV
    bytes each node's edge holds. Mutated only through the tree events below, which the
    cache reports as it changes the tree; invariant: every copy starts inside a page."""

    def __init__(self, layout: Layout, kv_bytes_per_token: int) -> None:
        self.layout = layout
        self.page_bytes = layout.page_size * kv_bytes_per_token
        self.copies: set[Node] = set()

    def kv_bytes(self, node: Node) -> int:
        """Bytes of KV `node`'s edge holds: the pages starting in it, and its copy."""
        if self.layout.page_size == 1:  # per token, never a copy: the edge's tokens
            return len(node.key) // TOKEN_BYTES * self.page_bytes
        start = node.depth - node.edge_len
        return (self.layout.starts(start, node.depth) + (node in self.copies)) * self.page_bytes

    def need(self, match: Match, n: int) -> int:
        """KV bytes a commit of `n` tokens adds when `match.length` of them are in the tree:
        the pages starting in the new tail, and a copy of the page where it branches off."""
        m = match.length
        if m >= n:
            return 0
        return (self.layout.starts(m, n) + self._branches(m)) * self.page_bytes

    def branched(self, leaf: Node) -> None:
        """`leaf` was hung under an existing node as a new branch: it copies its first page
        if that page began in the parent."""
        if self._branches(leaf.depth - leaf.edge_len):
            self.copies.add(leaf)

    def split(self, head: Node, tail: Node) -> None:
        """`tail`'s edge was cut and `head` took its front: the copy, if any, moves to the
        head; the page at the cut is shared."""
        if tail in self.copies:
            self.copies.discard(tail)
            self.copies.add(head)

    def merge(self, node: Node, child: Node) -> int:
        """`node` merged into `child` (called before the tree merges them): the child starts
        where `node` did (with its copy status); returns the bytes freed, the child's own
        copy of the page at the seam, unless a grandchild still shares that page.

        A child whose edge ends inside the page it copied shares that page with the
        grandchild that continues it (not a copy itself). The merge keeps `node`'s page
        for the seam, so the copy cannot be freed: the grandchild now holds it alone,
        and becomes the copy's owner."""
        if child not in self.copies:
            freed = 0
        else:
            self.copies.discard(child)
            freed = self.page_bytes
            size, start = self.layout.page_size, node.depth
            if child.depth % size and child.depth // size == start // size:
                for grandchild in child.children.values():
                    if grandchild not in self.copies:  # shares the copied page
                        self.copies.add(grandchild)
                        freed = 0
        if node in self.copies:
            self.copies.discard(node)
            self.copies.add(child)
        return freed

    def removed(self, node: Node) -> None:
        self.copies.discard(node)

    def _branches(self, start: int) -> int:
        return int(start % self.layout.page_size != 0)
