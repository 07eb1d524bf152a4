"""Shared test helpers: small specs and a store whose KV handles are token lists."""

from __future__ import annotations

from typing import Any

from marconi.spec import ModelSpec

# bytes small enough that a handful of entries fill a cache: KV 256 B/token, state 81,920 B
SMALL = ModelSpec(name="small", d_model=64, attention_layers=1, ssm_layers=8, mlp_layers=9,
                  d_state=64)


class ListStore:
    """KV handles are the tokens themselves, so joined path KV must spell the prefix."""

    def __init__(self) -> None:
        self.released_states: list[Any] = []
        self.released_kv: list[Any] = []

    def kv_slice(self, source: Any, start: int, stop: int) -> Any:
        return list(source[start:stop])

    def kv_split(self, kv: Any, at: int) -> tuple[Any, Any]:
        return kv[:at], kv[at:]

    def kv_join(self, first: Any, second: Any) -> Any:
        return first + second

    def release(self, kv: Any, state: Any) -> None:
        if kv is not None:
            self.released_kv.append(kv)
        if state is not None:
            self.released_states.append(state)
