"""marconi: prefix caching for hybrid (attention + SSM) LLMs.

```python
from marconi import PAPER_7B, PrefixCache
cache = PrefixCache(PAPER_7B, "2GB", "marconi")
```
"""

from __future__ import annotations

from marconi.cache import CommitResult, Plan, PrefixCache
from marconi.spec import PAPER_7B, ModelSpec, resolve_model
from marconi.store import Freed, NullStore, StateStore

__version__ = "0.1.0"

__all__ = ["PAPER_7B", "CommitResult", "Freed", "ModelSpec", "NullStore", "Plan",
           "PrefixCache", "StateStore", "resolve_model"]
