"""One embedded model per session; each test gets its own server (a fresh cache)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import needs

needs("torch", "fastapi", "openai")  # CI: a missing extra fails

from marconi.engines.hf import HybridModel  # noqa: E402
from marconi.server import embedded_model  # noqa: E402
from tests.server.harness import Served, serve  # noqa: E402


@pytest.fixture(scope="session")
def model() -> HybridModel:
    """The embedded tiny Bamba (Mistral v1 vocabulary); weights are never mutated."""
    return embedded_model(seed=0)


@pytest.fixture
def server(model: HybridModel) -> Iterator[Served]:
    """A server with a roomy cache, so nothing is evicted."""
    with serve(model, capacity="256MB", max_tokens=8) as served:
        yield served
