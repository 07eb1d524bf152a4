"""`marconi serve`: an OpenAI-compatible HTTP server over the reference engine.

```python
from marconi.server import ServerConfig, build_backend, create_app
config = ServerConfig(capacity="64MB")
app = create_app(build_backend(config), config)  # run with uvicorn
```
Needs the `engine` and `server` extras (torch, transformers, fastapi, uvicorn,
prometheus-client). The names load on first use: the body parser's process imports
`marconi.server.parsing` and must not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marconi.server.app import create_app
    from marconi.server.backend import Backend, build_backend, embedded_model
    from marconi.server.config import EMBEDDED_MODEL, ServerConfig

_HOMES = {"create_app": "app", "Backend": "backend", "build_backend": "backend",
          "embedded_model": "backend", "EMBEDDED_MODEL": "config", "ServerConfig": "config"}
__all__ = ["EMBEDDED_MODEL", "Backend", "ServerConfig", "build_backend", "create_app",
           "embedded_model"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'marconi.server' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"marconi.server.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
