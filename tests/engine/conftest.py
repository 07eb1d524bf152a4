"""Shared tiny models (random weights, float32), built once per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.helpers import needs

needs("torch", "transformers")  # CI: a missing extra fails

from marconi.engines.hf import HybridModel, tiny_model  # noqa: E402

_MODELS: dict[str, HybridModel] = {}


def _get_model(arch: str) -> HybridModel:
    if arch not in _MODELS:
        _MODELS[arch] = tiny_model(arch, seed=0)
    return _MODELS[arch]


@pytest.fixture(scope="session")
def get_model() -> Callable[[str], HybridModel]:
    """One tiny model per family for the whole session (models are never mutated)."""
    return _get_model
