"""The engine side of the cache: where tensors behind the handles live, and what an
eviction hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from marconi.core.policy import Action

Handle = Any  # an engine's opaque handle (tensors, slot ids); the cache never looks inside


class StateStore(Protocol):
    """Where the engine keeps the tensors behind the handles."""

    def kv_slice(self, source: Handle, start: int, stop: int) -> Handle:
        """KV of tokens [start, stop) of the sequence being committed (`source`)."""

    def kv_split(self, kv: Handle, at: int) -> tuple[Handle, Handle]:
        """An edge's KV cut after `at` tokens: (head, tail)."""

    def kv_join(self, first: Handle, second: Handle) -> Handle:
        """A node's KV merged in front of its child's."""

    def release(self, kv: Handle, state: Handle) -> None:
        """Free what an evicted entry held (either may be None)."""


class NullStore:
    """No tensors: byte accounting only (the simulator)."""

    def kv_slice(self, source: Handle, start: int, stop: int) -> Handle:
        return None

    def kv_split(self, kv: Handle, at: int) -> tuple[Handle, Handle]:
        return None, None

    def kv_join(self, first: Handle, second: Handle) -> Handle:
        return None

    def release(self, kv: Handle, state: Handle) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Freed:
    """What one eviction handed back (given to the `on_evict` callback)."""

    action: Action
    depth: int  # prefix length of the evicted node
    kv: Handle  # the KV handle freed (None when the KV moved into the child)
    state: Handle  # the state handle freed, if the node held one
    nbytes: int  # bytes released
