"""`TensorStore`: the real tensors behind a `PrefixCache`'s opaque handles.

Implements the cache's `StateStore` protocol. An edge's handle is a `KVBlock` (K/V of its
tokens, every attention layer); a checkpoint's handle is an `SSMState`. Slices and splits
clone, so no stored tensor keeps a larger one alive, and `release` drops the store's last
reference: evicted memory is really freed. Byte counters let tests check the tensors
against the spec and the cache's own accounting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import DynamicCache

from marconi.core.state_store import Handle
from marconi.engines.hf.models import HybridModel
from marconi.engines.hf.state import KVBlock, SSMState, concat_kv, snapshot_kv


@dataclass(frozen=True, slots=True)
class KVSource:
    """The live cache of a sequence being committed: `kv_slice` reads its K/V."""

    cache: DynamicCache


class TensorStore:
    """KV per tree edge and SSM state per checkpoint, as tensors, with byte counters."""

    def __init__(self, model: HybridModel) -> None:
        self.model = model
        self.kv_bytes = 0  # K/V held by tree edges
        self.state_bytes = 0  # conv + recurrent states held (what the spec sizes)
        self.logits_bytes = 0  # next-token logits kept with the states (not in the spec)

    @property
    def nbytes(self) -> int:
        """Everything held: KV, states and their logits."""
        return self.kv_bytes + self.state_bytes + self.logits_bytes

    def track(self, state: SSMState) -> SSMState:
        """Count a state the engine hands to `commit`; the cache owns (or releases) it."""
        self.state_bytes += state.nbytes
        self.logits_bytes += state.logits_bytes
        return state

    def state(self, handle: SSMState) -> SSMState:
        """The state behind a handle (here the handle itself)."""
        return handle

    def gather(self, handles: Sequence[KVBlock]) -> KVBlock | None:
        """The K/V of consecutive edges as one block (None: no edge)."""
        return concat_kv(list(handles))

    # --- StateStore protocol ----------------------------------------------------------

    def kv_slice(self, source: KVSource, start: int, stop: int) -> KVBlock:
        block = snapshot_kv(self.model, source.cache, start, stop)
        self.kv_bytes += block.nbytes
        return block

    def kv_split(self, kv: KVBlock, at: int) -> tuple[KVBlock, KVBlock]:
        return kv.slice(0, at), kv.slice(at, kv.tokens)  # same bytes, two owners

    def kv_join(self, first: KVBlock, second: KVBlock) -> KVBlock:
        joined = concat_kv([first, second])
        if joined is None or joined is first or joined is second:
            raise ValueError("kv_join needs two blocks")
        first.free()  # consumed: the merged node may outlive the merge
        second.free()
        return joined

    def release(self, kv: Handle, state: Handle) -> None:
        if isinstance(kv, KVBlock):
            self.kv_bytes -= kv.nbytes
            kv.free()
        if isinstance(state, SSMState):
            self.state_bytes -= state.nbytes
            self.logits_bytes -= state.logits_bytes
            state.free()
