"""The engine side of the cache: where tensors behind the handles live, and what an
eviction hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from marconi.policies import Action


class StateStore(Protocol):
    """Where the engine keeps the tensors behind the handles."""

    def kv_slice(self, source: Any, start: int, stop: int) -> Any:
        """KV of tokens [start, stop) of the sequence being committed (`source`)."""

    def kv_split(self, kv: Any, at: int) -> tuple[Any, Any]:
        """An edge's KV cut after `at` tokens: (head, tail)."""

    def kv_join(self, first: Any, second: Any) -> Any:
        """A node's KV merged in front of its child's."""

    def release(self, kv: Any, state: Any) -> None:
        """Free what an evicted entry held (either may be None)."""


class NullStore:
    """No tensors: byte accounting only (the simulator)."""

    def kv_slice(self, source: Any, start: int, stop: int) -> Any:
        return None

    def kv_split(self, kv: Any, at: int) -> tuple[Any, Any]:
        return None, None

    def kv_join(self, first: Any, second: Any) -> Any:
        return None

    def release(self, kv: Any, state: Any) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Freed:
    """What one eviction handed back (given to the `on_evict` callback)."""

    action: Action
    depth: int  # prefix length of the evicted node
    kv: Any  # the KV handle freed (None when the KV moved into the child)
    state: Any  # the state handle freed, if the node held one
    nbytes: int  # bytes released
