"""The reference engine: real Hugging Face hybrid models with cached KV and SSM tensors.

```python
from marconi.engine import Engine, tiny_model
engine = Engine(tiny_model("bamba"), system="marconi", capacity="1GB")
result = engine.generate(prompt_ids, max_new_tokens=16)
```
Needs the `engine` extra (torch, transformers).
"""

from __future__ import annotations

import marconi.engine._versions  # noqa: F401  (first: refuses a transformers too old)
from marconi.engine import _kernels
from marconi.engine.engine import Engine, Generation, Timings
from marconi.engine.models import (
    ARCHITECTURES,
    Architecture,
    HybridModel,
    architecture,
    load_model,
    tiny_model,
)
from marconi.engine.paged_store import PagedStore, PooledState
from marconi.engine.prefill import Capture, PrefillResult, capture_points, forward, prefill
from marconi.engine.sampling import Sampling, sample
from marconi.engine.state import KVBlock, SSMState, restore, snapshot_kv, snapshot_state
from marconi.engine.tensor_store import KVSource, TensorStore

_kernels.install()  # transformers' four reference-kernel notices: one line of ours

__all__ = [
    "ARCHITECTURES", "Architecture", "Capture", "Engine", "Generation", "HybridModel",
    "KVBlock", "KVSource", "PagedStore", "PooledState", "PrefillResult", "SSMState", "Sampling",
    "TensorStore", "Timings",
    "architecture", "capture_points", "forward", "load_model", "prefill", "restore", "sample",
    "snapshot_kv", "snapshot_state", "tiny_model",
]
