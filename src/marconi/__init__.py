"""marconi: prefix caching for hybrid (attention + SSM) LLMs.

```python
from marconi import PAPER_7B, make_cache
cache = make_cache(PAPER_7B, "2GB", "marconi")
```
`import marconi` loads nothing of marconi: the core's names (`marconi.core`), the registry
of named systems (`make_cache`, `SYSTEMS`, `get_system`) and the notebook API (`simulate`,
`compare`, `load`: `marconi.api`) load on first use. So a module of marconi run where only
part of it can load (an engine worker in the engine's own environment, `marconi.engines.real`)
imports as a module of the package and loads what it imports, no more.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from marconi.api import compare, load, simulate
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
    from marconi.systems import SYSTEMS, System, get_system, make_cache


def _version() -> str:
    try:
        return metadata.version("marconi")
    except metadata.PackageNotFoundError:  # run from a source tree never installed
        return "0+unknown"


__version__ = _version()
_CORE = ("PAPER_7B", "CommitResult", "Freed", "ModelSpec", "NullStore", "Plan", "PrefixCache",
         "StateStore", "resolve_model")
_LAZY = {**dict.fromkeys(_CORE, "marconi.core"),
         **dict.fromkeys(("SYSTEMS", "System", "get_system", "make_cache"), "marconi.systems"),
         **dict.fromkeys(("simulate", "compare", "load"), "marconi.api")}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marconi' has no attribute {name!r}")


__all__ = ["PAPER_7B", "SYSTEMS", "CommitResult", "Freed", "ModelSpec", "NullStore", "Plan",
           "PrefixCache", "StateStore", "System", "compare", "get_system", "load",
           "make_cache", "resolve_model", "simulate"]
