"""Snapshots of a model's cache: KV slices per token range and SSM checkpoints.

transformers updates conv and recurrent states in place and grows KV by concatenation, so
every snapshot here is a clone: a stored tensor never aliases a live cache, and restoring
copies into a fresh cache (restoring the same checkpoint twice gives the same result).
Tensors are held without the batch dimension:

    KV     per attention layer: keys/values (kv_heads, tokens, head_dim)
    state  per SSM layer: conv (channels, kernel) and recurrent (heads, ..., d_state)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from marconi.engines.hf.models import HybridModel


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(slots=True)
class KVBlock:
    """K and V of a contiguous token range, one tensor pair per attention layer.

    Mutable only through `free`: a handle the cache has let go of may still be referenced
    (e.g. by an eviction policy's lazy heap), so the store empties it to really free it.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    def free(self) -> None:
        self.keys, self.values = (), ()

    @property
    def tokens(self) -> int:
        return int(self.keys[0].shape[-2]) if self.keys else 0

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys) + _nbytes(self.values)

    def slice(self, start: int, stop: int) -> KVBlock:
        """Tokens [start, stop) of this block, cloned so the parent's memory can be freed."""
        if not 0 <= start <= stop <= self.tokens:
            raise ValueError(f"KV slice [{start}, {stop}) outside a block of {self.tokens}")
        return KVBlock(tuple(k[:, start:stop].clone() for k in self.keys),
                       tuple(v[:, start:stop].clone() for v in self.values))


def concat_kv(blocks: Sequence[KVBlock]) -> KVBlock | None:
    """The blocks joined along the token axis; None when there are none."""
    if not blocks:
        return None
    if len(blocks) == 1:
        return blocks[0]
    layers = range(len(blocks[0].keys))
    return KVBlock(tuple(torch.cat([b.keys[i] for b in blocks], dim=1) for i in layers),
                   tuple(torch.cat([b.values[i] for b in blocks], dim=1) for i in layers))


@dataclass(slots=True)
class SSMState:
    """Conv and recurrent state of every SSM layer after exactly `position` tokens.

    `logits` (the next-token logits after `position` tokens) ride along so that a prompt
    equal to a cached prefix still gets its first token without recomputing anything. They
    are not SSM state: `nbytes` (what the spec sizes) leaves them out, `logits_bytes` says
    what they add; the engine's cache counts them against its capacity through
    `ModelSpec.checkpoint_extra_bytes`.
    """

    position: int
    conv: tuple[torch.Tensor, ...]
    recurrent: tuple[torch.Tensor, ...]
    logits: torch.Tensor  # (vocab,), float32

    @property
    def nbytes(self) -> int:
        return _nbytes(self.conv) + _nbytes(self.recurrent)

    @property
    def logits_bytes(self) -> int:
        return _nbytes((self.logits,))

    def free(self) -> None:
        """Drop the tensors (the handle may outlive its release); see `KVBlock.free`."""
        self.conv, self.recurrent, self.logits = (), (), torch.empty(0)


def snapshot_state(model: HybridModel, cache: DynamicCache, position: int,
                   logits: torch.Tensor) -> SSMState:
    """Clone the SSM layers' states out of a live cache that has seen `position` tokens;
    `logits` are the next-token logits the last forward returned."""
    layers = [_ssm_layer(cache, i) for i in model.ssm_layers]
    return SSMState(position,
                    tuple(_held(layer.conv_states[0])[0].clone() for layer in layers),
                    tuple(_held(layer.recurrent_states[0])[0].clone() for layer in layers),
                    logits.detach().float().clone())


def snapshot_kv(model: HybridModel, cache: DynamicCache, start: int, stop: int) -> KVBlock:
    """Clone the K/V of tokens [start, stop) out of a live cache."""
    layers = [_kv_layer(cache, i) for i in model.attention_layers]
    return KVBlock(tuple(_held(layer.keys)[0, :, start:stop].clone() for layer in layers),
                   tuple(_held(layer.values)[0, :, start:stop].clone() for layer in layers))


def restore(model: HybridModel, kv: KVBlock | None, state: SSMState | None) -> DynamicCache:
    """A fresh cache holding copies of `kv` (the prefix's K/V) and `state` (its SSM state).

    Both must describe the same prefix: `kv.tokens == state.position`. With neither, the
    cache is empty (a cold start).
    """
    cache = model.new_cache()
    if state is None:
        if kv is not None and kv.tokens:
            raise ValueError("restoring KV without the SSM state of the same prefix")
        return cache
    if (kv.tokens if kv is not None else 0) != state.position:
        raise ValueError(f"KV holds {kv.tokens if kv else 0} tokens but the state is at "
                         f"{state.position}")
    for index, conv, recurrent in zip(model.ssm_layers, state.conv, state.recurrent,
                                      strict=True):
        _restore_ssm_layer(_ssm_layer(cache, index), conv, recurrent)
    if kv is not None and kv.tokens:
        for index, keys, values in zip(model.attention_layers, kv.keys, kv.values, strict=True):
            _kv_layer(cache, index).update(keys[None], values[None])  # concatenates: a copy
    return cache


def _restore_ssm_layer(layer: LinearAttentionLayer, conv: torch.Tensor,
                       recurrent: torch.Tensor) -> None:
    layer.lazy_initialization(conv_states=conv[None], recurrent_states=recurrent[None])
    _held(layer.conv_states[0]).copy_(conv[None])
    _held(layer.recurrent_states[0]).copy_(recurrent[None])
    layer.has_previous_state[0] = True


def _ssm_layer(cache: DynamicCache, index: int) -> LinearAttentionLayer:
    return cast(LinearAttentionLayer, cache.layers[index])


def _kv_layer(cache: DynamicCache, index: int) -> DynamicLayer:
    return cast(DynamicLayer, cache.layers[index])


def _held(tensor: torch.Tensor | None) -> torch.Tensor:
    if tensor is None:
        raise RuntimeError("cache layer holds no tensor yet: run a forward pass first")
    return tensor
