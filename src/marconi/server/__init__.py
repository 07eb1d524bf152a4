"""`marconi serve`: an OpenAI-compatible HTTP server over the reference engine.

```python
from marconi.server import ServerConfig, build_backend, create_app
config = ServerConfig(cache_size="64MB")
app = create_app(build_backend(config), config)  # run with uvicorn
```
Needs the `engine` and `server` extras (torch, transformers, fastapi, uvicorn,
prometheus-client).
"""

from __future__ import annotations

from marconi.server.app import create_app
from marconi.server.backend import Backend, build_backend, embedded_model
from marconi.server.config import EMBEDDED_MODEL, ServerConfig

__all__ = ["EMBEDDED_MODEL", "Backend", "ServerConfig", "build_backend", "create_app",
           "embedded_model"]
