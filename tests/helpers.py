"""Shared test helpers: small specs and a store whose KV handles are token lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marconi.core.cache import PrefixCache
from marconi.core.spec import ModelSpec
from marconi.core.tuning import Tuner
from marconi.sim.summary import Summary

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


def serve(cache: PrefixCache, tuner: Tuner | None, tokens: object, n_input: int,
          boundaries: Sequence[int] = ()) -> int:
    """One request as a driver runs it: lookup, commit input + output, then the tuner.
    Returns the hit."""
    arr = np.asarray(tokens, dtype=np.int32)
    hit = cache.lookup(arr[:n_input], boundaries=boundaries).hit
    cache.commit(arr, n_input, boundaries=boundaries)
    if tuner is not None:
        tuner.observe(cache, arr, n_input, boundaries)
    return hit


def cache_systems() -> dict[str, Any]:
    """The registered systems that are in-process caches (not a real engine's replay)."""
    from marconi.systems import SYSTEMS

    return {name: s for name, s in SYSTEMS.items() if s.engine is None}


CACHES = cache_systems()  # the registry's caches, for tests parametrized over them
EXAMPLES_ENV = "MARCONI_TEST_EXAMPLES"


def examples(n: int) -> int:
    """`n` random cases (a property test's examples, a fuzz loop's seeds), times the
    factor `MARCONI_TEST_EXAMPLES` gives (default 1; scripts/test-floors.sh runs the
    suite again at the dependencies' floors with fewer), at least 1."""
    import os

    raw = os.environ.get(EXAMPLES_ENV, "1")
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{EXAMPLES_ENV}={raw!r}: expected a number > 0") from None
    if not factor > 0:
        raise ValueError(f"{EXAMPLES_ENV}={raw!r}: expected a number > 0")
    return max(1, round(n * factor))


def needs(*modules: str) -> None:
    """Skip the calling test module unless `modules` import; under CI (CI=true), which
    installs every extra, fail instead: a missing extra must not skip a folder silently."""
    import importlib.util
    import os

    import pytest

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed"
    if os.environ.get("CI"):
        raise ImportError(f"{message}: CI installs every extra, so this is a broken install")
    pytest.skip(message, allow_module_level=True)


def make_summary(**figures: Any) -> Summary:
    """A run's `Summary` with every figure zero (or absent) but those given."""
    zero = {name: 0 for name in Summary.__dataclass_fields__}
    absent = ("alpha", "alpha_status", "page_size", "state_slots", "kv_bytes_final",
              "ssm_bytes_final", "bounds_dropped_at", "bounds", "hit_rate_by_input_length",
              "tuning", "engine", "experts", "served")
    text = {"system": "x", "replay": "serving", "trace": "t", "capacity": "1GB",
            "model": "paper-7b"}
    return Summary(**(zero | dict.fromkeys(absent) | text | figures))
