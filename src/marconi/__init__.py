"""marconi: prefix caching for hybrid (attention + SSM) LLMs."""

from __future__ import annotations

__version__ = "0.1.0"
