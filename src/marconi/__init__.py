"""marconi: prefix caching for hybrid (attention + SSM) LLMs.

```python
from marconi import PAPER_7B, make_cache
cache = make_cache(PAPER_7B, "2GB", "marconi")
```
`import marconi` loads the core only; the registry of named systems (`make_cache`,
`SYSTEMS`, `get_system`) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marconi.core import (
    PAPER_7B,
    CommitResult,
    Freed,
    ModelSpec,
    NullStore,
    Plan,
    PrefixCache,
    StateStore,
    resolve_model,
)

if TYPE_CHECKING:
    from marconi.systems import SYSTEMS, System, get_system, make_cache

__version__ = "0.1.0"
_REGISTRY = ("SYSTEMS", "System", "get_system", "make_cache")


def __getattr__(name: str) -> object:
    if name in _REGISTRY:
        import marconi.systems

        return getattr(marconi.systems, name)
    raise AttributeError(f"module 'marconi' has no attribute {name!r}")


__all__ = ["PAPER_7B", "SYSTEMS", "CommitResult", "Freed", "ModelSpec", "NullStore", "Plan",
           "PrefixCache", "StateStore", "System", "get_system", "make_cache", "resolve_model"]
