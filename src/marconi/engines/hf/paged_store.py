"""`PagedStore`: the reference engine's tensors in a paged KV pool and a state-slot pool.

The memory layout of today's engines (docs/embedding.md): K/V of cached edges in pages of
`page_size` tokens, one row per page in a pool tensor per attention layer; SSM states in
slots, one row per slot in a pool tensor per SSM layer (conv and recurrent) plus their
next-token logits. Handles: a `PageRun` per edge (pages by `marconi.core.pages.PagePool`,
shared and copied as the cache's page books count them), a `PooledState` per state.

```
K pool, one attention layer:  (pages, kv_heads, page_size, head_dim)
conv pool, one SSM layer:     (slots, channels, kernel)
```
Pools grow by doubling up to their limits (the KV budget in pages; the state slots plus
`working_slots` for the states of the request in flight), so a cache whose books
undercounted pages would overflow them: a `MemoryError`, never a silent overshoot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from marconi.core.pages import PageCopy, PagePool, PageRun
from marconi.core.state_store import Handle
from marconi.engines.hf.models import HybridModel
from marconi.engines.hf.state import KVBlock, SSMState, concat_kv, snapshot_kv
from marconi.engines.hf.tensor_store import KVSource


@dataclass(frozen=True, slots=True)
class PooledState:
    """A state held in slot `index` of the pool, after `position` tokens."""

    index: int
    position: int


class Rows:
    """Tensors sharing a row index (one per layer), grown by doubling up to `limit` rows."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.tensors: list[torch.Tensor] = []

    def fit(self, row: int, like: Sequence[torch.Tensor]) -> None:
        """Make row `row` exist; `like`: one row of each column (shape and dtype)."""
        if self.limit is not None and row >= self.limit:
            raise MemoryError(f"pool of {self.limit} rows exhausted")
        size = self.tensors[0].shape[0] if self.tensors else 0
        if row < size:
            return
        grown = max(row + 1, 2 * size, 4)
        grown = grown if self.limit is None else min(grown, self.limit)
        if not self.tensors:
            self.tensors = [t.new_zeros((0, *t.shape)) for t in like]
        self.tensors = [torch.cat([t, t.new_zeros((grown - size, *t.shape[1:]))])
                        for t in self.tensors]

    def row_bytes(self, columns: slice = slice(None)) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors[columns])


class PagedStore:
    """KV in pages, states in slots; byte counters like `TensorStore`'s."""

    def __init__(self, model: HybridModel, page_size: int, *, pages: int | None = None,
                 slots: int | None = None, working_slots: int = 64) -> None:
        """`pages`: the most pages ever held (None: no limit); `slots`: states the cache
        may hold (None: no limit), plus `working_slots` for a request's captures."""
        self.model = model
        self.pool = PagePool(page_size, pages)
        self.kv = Rows(pages)  # keys of each attention layer, then values
        self.states = Rows(None if slots is None else slots + working_slots)
        self.free_slots: list[int] = []
        self.slots_made = 0
        self.slots_in_use = 0
        self.state_bytes = 0  # conv + recurrent states held (what the spec sizes)
        self.logits_bytes = 0  # next-token logits kept with the states

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    @property
    def kv_bytes(self) -> int:
        """Bytes of the pages in use (whole pages: what the cache's books count)."""
        return self.pool.in_use * self.kv.row_bytes() if self.kv.tensors else 0

    @property
    def nbytes(self) -> int:
        return self.kv_bytes + self.state_bytes + self.logits_bytes

    # --- the engine's side: captured states in, handles out -------------------------

    def track(self, state: SSMState) -> PooledState:
        """Copy a captured state into a free slot (the cache owns the slot from here)."""
        index = self.free_slots.pop() if self.free_slots else self.slots_made
        self.slots_made = max(self.slots_made, index + 1)
        tensors = (*state.conv, *state.recurrent, state.logits)
        self.states.fit(index, tensors)
        for pool, tensor in zip(self.states.tensors, tensors, strict=True):
            pool[index].copy_(tensor)
        self.slots_in_use += 1
        self.state_bytes += state.nbytes
        self.logits_bytes += state.logits_bytes
        state.free()
        return PooledState(index, state.position)

    def state(self, handle: PooledState) -> SSMState:
        """The state in a slot: views of the pool (restoring copies them), logits cloned."""
        rows = [t[handle.index] for t in self.states.tensors]
        n = len(self.model.ssm_layers)
        return SSMState(handle.position, tuple(rows[:n]), tuple(rows[n : 2 * n]),
                        rows[-1].clone())

    def gather(self, handles: Sequence[PageRun]) -> KVBlock | None:
        """The K/V the runs hold, in order, as one contiguous block (copied out)."""
        return concat_kv([self._block(run) for run in handles])

    def _block(self, run: PageRun) -> KVBlock:
        size, first = self.page_size, run.start // self.page_size
        index = torch.tensor(run.pages)
        lo, hi = run.start - first * size, run.stop - first * size
        tokens = [t.index_select(0, index).permute(1, 0, 2, 3).flatten(1, 2)[:, lo:hi]
                  for t in self.kv.tensors]
        half = len(tokens) // 2
        return KVBlock(tuple(tokens[:half]), tuple(tokens[half:]))

    # --- StateStore protocol ----------------------------------------------------------

    def kv_slice(self, source: KVSource, start: int, stop: int) -> PageRun:
        run, fresh = self.pool.slice(source, start, stop)
        size = self.page_size
        for logical, page in fresh:  # whole pages: a first page also holds the parent's part
            block = snapshot_kv(self.model, source.cache, logical * size, (logical + 1) * size)
            tensors = (*block.keys, *block.values)  # (kv_heads, <= size tokens, head_dim)
            self.kv.fit(page, [t.new_empty((t.shape[0], size, t.shape[2])) for t in tensors])
            for pool, tensor in zip(self.kv.tensors, tensors, strict=True):
                pool[page, :, : tensor.shape[1]].copy_(tensor)
        return run

    def kv_split(self, kv: PageRun, at: int) -> tuple[PageRun, PageRun]:
        return self.pool.split(kv, at)

    def kv_join(self, first: PageRun, second: PageRun) -> PageRun:
        joined, copy = self.pool.join(first, second)
        if copy is not None:
            self._copy(copy)
        return joined

    def release(self, kv: Handle, state: Handle) -> None:
        if isinstance(kv, PageRun):
            self.pool.release(kv)
        if isinstance(state, PooledState):
            self.state_bytes -= self.states.row_bytes(slice(None, -1))
            self.logits_bytes -= self.states.row_bytes(slice(-1, None))
            self.free_slots.append(state.index)
            self.slots_in_use -= 1

    def _copy(self, copy: PageCopy) -> None:
        for pool in self.kv.tensors:
            seam = slice(copy.first, copy.last)
            pool[copy.target, :, seam] = pool[copy.source, :, seam]
