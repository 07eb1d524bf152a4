"""marconi: prefix caching for hybrid (attention + SSM) LLMs.

```python
from marconi import PAPER_7B, make_cache
cache = make_cache(PAPER_7B, "2GB", "marconi")
```
`import marconi` loads the core only; the registry of named systems (`make_cache`,
`SYSTEMS`, `get_system`) and the notebook API (`simulate`, `compare`, `load`:
`marconi.api`) load on first use.
"""

from __future__ import annotations

import importlib
from importlib import metadata
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
    from marconi.api import compare, load, simulate
    from marconi.systems import SYSTEMS, System, get_system, make_cache


def _version() -> str:
    try:
        return metadata.version("marconi")
    except metadata.PackageNotFoundError:  # run from a source tree never installed
        return "0+unknown"


__version__ = _version()
_LAZY = {"SYSTEMS": "marconi.systems", "System": "marconi.systems",
         "get_system": "marconi.systems", "make_cache": "marconi.systems",
         "simulate": "marconi.api", "compare": "marconi.api", "load": "marconi.api"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marconi' has no attribute {name!r}")


__all__ = ["PAPER_7B", "SYSTEMS", "CommitResult", "Freed", "ModelSpec", "NullStore", "Plan",
           "PrefixCache", "StateStore", "System", "compare", "get_system", "load",
           "make_cache", "resolve_model", "simulate"]
