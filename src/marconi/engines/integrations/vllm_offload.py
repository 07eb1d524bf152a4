"""Marconi's order for vLLM's CPU offload tier, through its one supported extension point:
a `CachePolicy` (`vllm.v1.kv_offload.cpu.policies.base`) loaded out of tree by
`cache_policy_module_path`, with no patch to vLLM (docs/integrations.md, "Marconi as
vLLM's offload cache policy").

vLLM's `OffloadingConnector` copies the blocks a request computes to a host (CPU) tier
beside the GPU pool, and loads them back for a later request whose prefix the GPU no
longer holds. The tier's `CPUOffloadingManager` keeps the book-keeping (reference counts,
the chunk pool, the store and load skeletons) and asks its policy which chunks to evict;
vLLM ships `lru` and `arc`. One line in `--kv-transfer-config` selects this one:

    "kv_connector_extra_config": {"cpu_bytes_to_use": ..., "eviction_policy":
        "MarconiCachePolicy",
        "cache_policy_module_path": "marconi.engines.integrations.vllm_offload"}

with `MARCONI_MODEL` naming the model (as for the plugin) and `MARCONI_ALPHA` the weight
of FLOP efficiency (default `DEFAULT_ALPHA`, 0; no tuner runs beside the tier).

**The order.** First go the KV chunks no hit can use: a hit ends at a Mamba state, so KV
past the deepest state any finished request showed on it saves nothing (the vLLM plugin
takes such KV first too); least recently used first. Then the lowest `recency + alpha x
efficiency`, both min-max normalized over the candidates, recency the order of their last
use (a request's chunks used tail to head, as vLLM's `lru` orders them: at alpha 0, with
every chunk usable, the order is exactly `lru`'s), efficiency the prefill FLOPs the
chunk's span saves, `F(end) - F(parent's end)` (every chunk of the tier holds the same
bytes), where a chunk is one KV cache group's blocks of a request at an end position
(vLLM's `OffloadKey`, its position from `ReqContext.get_offload_key_position`) and its
parent the chunk before it in the same group on the request that stored it.

It implements vLLM 0.33's `touch` and 0.34's `on_request_finished` (0.34 dropped `touch`);
it is loaded and driven here through 0.34 only (tests/test_offload_policy.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marconi.core.priority import Feature
from marconi.core.scores import OVER_A_LIST, FlopsAt, check_features, evaluate, ranks
from marconi.core.spec import ModelSpec
from marconi.engines.integrations.common import ALPHA, MODEL, IntegrationError, declared_score

try:  # vLLM's own base class where vLLM is installed; a stand-in elsewhere (docs, mypy)
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as _Base
except ImportError:  # pragma: no cover - imported without vLLM: the class cannot be used
    _Base = object

WHO = "marconi.engines.integrations.vllm_offload"
# measured through vLLM 0.34's classes (benchmarks/RESULTS.md, "Marconi as vLLM's offload
# cache policy"): any alpha above 0 saved less than vLLM's lru on ShareGPT, so by default
# the order is lru's with the KV no hit can use taken first
DEFAULT_ALPHA = 0.0


def _group(key: bytes) -> int:
    """The KV cache group of an `OffloadKey` (vLLM's `get_offload_group_idx`: the last
    four bytes, big-endian)."""
    return int.from_bytes(key[-4:], "big")


@dataclass
class _Seen:
    """What one request has shown the policy: its keys' end positions, by group."""

    owner: object
    by_group: dict[int, dict[int, bytes]] = field(default_factory=dict)


def settings() -> tuple[ModelSpec, float]:
    """The model and alpha from `MARCONI_MODEL` and `MARCONI_ALPHA`; IntegrationError
    (one line) when the model is missing or either is wrong."""
    from marconi.core.policy import check_alpha
    from marconi.core.spec import model_from

    if MODEL not in os.environ:
        raise IntegrationError(f"{WHO}: MarconiCachePolicy needs {MODEL} (a marconi model "
                               "name or config path)")
    try:
        spec = model_from(os.environ[MODEL])
    except ValueError as err:
        raise IntegrationError(f"{WHO}: {MODEL}: {err}") from None
    raw = os.environ.get(ALPHA)
    try:
        alpha = check_alpha(float(raw)) if raw else DEFAULT_ALPHA
    except ValueError:
        raise IntegrationError(f"{WHO}: {ALPHA}={raw!r} is not a finite number >= 0"
                               ) from None
    return spec, alpha


class MarconiCachePolicy(_Base):
    """vLLM's `CachePolicy` with Marconi's order (module docstring)."""

    def __init__(self, cache_capacity: int, spec: ModelSpec | None = None,
                 alpha: float | None = None) -> None:
        if spec is None:
            spec, default = settings()
            alpha = default if alpha is None else alpha
        score = declared_score("marconi", spec)  # `RECENCY`: a chunk's rank by last use
        check_features(score, OVER_A_LIST, "marconi's offload policy")
        super().__init__(cache_capacity)
        self.spec, self.alpha = spec, DEFAULT_ALPHA if alpha is None else float(alpha)
        self.score = score
        self._f = FlopsAt(spec)
        self.chunks: dict[bytes, Any] = {}  # key -> vLLM's ChunkStatus
        self.used: dict[bytes, int] = {}  # key -> its last use (a counter)
        self.end: dict[bytes, int] = {}  # key -> its end position (tokens)
        self.parent: dict[bytes, bytes | None] = {}
        self.children: dict[bytes, int] = {}  # key -> cached chunks whose parent it is
        self.evictable: set[bytes] = set()
        # KV chunks some finished request showed a state at or past (a hit can end past
        # them); the other KV chunks no hit can use yet, and they leave first
        self.covered: set[bytes] = set()
        self.clock = 0

    # --- what a request shows ----------------------------------------------------------

    def _seen(self, req_context: Any) -> _Seen:
        seen = req_context.get_state(_Seen)
        if seen is None or seen.owner is not self:
            seen = _Seen(self)
            req_context.set_state(seen)
        return seen

    def _note(self, keys: Iterable[bytes], req_context: Any) -> None:
        by_group = self._seen(req_context).by_group
        for key in keys:
            end = req_context.get_offload_key_position(key)
            if end is not None:
                by_group.setdefault(_group(key), {})[end] = key

    def _stamp(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            if key in self.chunks:
                self.clock += 1
                self.used[key] = self.clock

    # --- vLLM's CachePolicy ------------------------------------------------------------

    def get(self, key: bytes) -> Any:
        return self.chunks.get(key)

    def insert(self, key: bytes, chunk: Any, req_context: Any) -> None:
        self.chunks[key] = chunk
        self._note((key,), req_context)
        end = req_context.get_offload_key_position(key)
        self.end[key] = 0 if end is None else int(end)
        parent = None
        if end is not None:  # the nearest chunk before it in its group on this request
            before = [e for e in self._seen(req_context).by_group.get(_group(key), {})
                      if e < end]
            if before:
                parent = self._seen(req_context).by_group[_group(key)][max(before)]
        self.parent[key] = parent
        self.children.setdefault(key, 0)
        if parent is not None and parent in self.chunks:
            self.children[parent] = self.children.get(parent, 0) + 1
        self._stamp((key,))
        if chunk.ref_cnt == 0:
            self.evictable.add(key)

    def remove(self, key: bytes) -> None:
        self._drop(key)

    def _drop(self, key: bytes) -> None:
        del self.chunks[key]
        self.used.pop(key, None)
        self.end.pop(key, None)
        self.evictable.discard(key)
        self.children.pop(key, None)
        self.covered.discard(key)
        parent = self.parent.pop(key, None)
        if parent is not None and self.children.get(parent, 0) > 0:
            self.children[parent] -= 1

    def on_request_access(self, keys: Iterable[bytes], req_context: Any) -> None:
        self._note(keys, req_context)

    def touch(self, keys: Iterable[bytes], req_context: Any) -> None:
        """Used now (vLLM 0.33's hook; 0.34 calls `on_request_finished` instead): the
        keys in the order given, the last the most recent."""
        keys = list(keys)
        self._note(keys, req_context)
        self._stamp(keys)

    def on_request_finished(self, key_groups: Sequence[Sequence[bytes]],
                            insertion_only_keys: set[bytes], reused_keys: set[bytes],
                            req_context: Any) -> None:
        """A finished request's chunks, used tail to head (each group head to tail as
        given), so that its head is the most recent, as vLLM's LRU orders them."""
        del insertion_only_keys, reused_keys
        keys = [key for group in key_groups for key in group]
        self._note(keys, req_context)
        self._cover(key_groups, req_context)
        keys.sort(key=lambda k: -(req_context.get_offload_key_position(k) or 0))
        self._stamp(keys)

    def _cover(self, key_groups: Sequence[Sequence[bytes]], req_context: Any) -> None:
        """Mark the request's KV chunks that end at or before its deepest state. The tier
        is not told which groups hold states: on one request, a KV group has a chunk for
        every block it computed, a state group for some of them, so the groups with the
        most chunks are taken for KV and the others for states; where all have as many,
        every chunk is taken as usable."""
        sizes = [len(group) for group in key_groups]
        if not sizes or min(sizes) == max(sizes):
            for group in key_groups:
                self.covered.update(group)
            return
        position = req_context.get_offload_key_position
        deepest = max((position(k) or 0 for group in key_groups if len(group) < max(sizes)
                       for k in group), default=0)
        for group in key_groups:
            if len(group) == max(sizes):
                self.covered.update(k for k in group if (position(k) or 0) <= deepest)
            else:
                self.covered.update(group)

    def mark_evictable(self, key: bytes) -> None:
        self.evictable.add(key)

    def mark_non_evictable(self, key: bytes) -> None:
        self.evictable.discard(key)

    def clear(self) -> None:
        for book in (self.chunks, self.used, self.end, self.parent, self.children):
            book.clear()
        self.evictable.clear()
        self.covered.clear()
        self.clock = 0

    def efficiency(self, key: bytes) -> float:
        """The prefill FLOPs the chunk's span saves (its parent's end to its own)."""
        parent = self.parent.get(key)
        top = self.end.get(parent, 0) if parent is not None else 0
        return self._f(self.end[key]) - self._f(min(top, self.end[key]))

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Any]] | None:
        """Exactly `n` chunks, none of `protected`: KV no hit can use first (least
        recently used first), then the lowest scores; None, with nothing changed, when
        fewer than `n` are evictable."""
        if n == 0:
            return []
        free = [k for k in self.evictable if k not in protected]
        if len(free) < n:
            return None
        free.sort(key=self.used.__getitem__)  # least recently used first
        chosen = [k for k in free if k not in self.covered][:n]
        if len(chosen) < n:
            rest = [k for k in free if k in self.covered]
            if len(rest) < 2 or self.score.by_recency(self.alpha):
                chosen += rest[:n - len(chosen)]
            else:
                eff = np.array([self.efficiency(k) for k in rest])
                values = {Feature.RECENCY: ranks(len(eff)), Feature.EFFICIENCY: eff}
                order = np.argsort(evaluate(self.score, values, self.alpha), kind="stable")
                chosen += [rest[int(i)] for i in order[:n - len(chosen)]]
        out = []
        for key in chosen:
            out.append((key, self.chunks[key]))
            self._drop(key)
        return out
