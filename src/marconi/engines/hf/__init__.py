"""The reference engine: real Hugging Face hybrid models with cached KV and SSM tensors.

```python
from marconi.engines.hf import Engine, tiny_model
engine = Engine(tiny_model("bamba"), system="marconi", capacity="1GB")
result = engine.generate(prompt_ids, max_new_tokens=16)
```
Needs the `engine` extra (torch, transformers).
"""

from __future__ import annotations

import marconi.engines.hf._versions  # noqa: F401  (first: refuses a transformers too old)
from marconi.engines.hf import _kernels
from marconi.engines.hf.engine import Engine, Generation, Timings
from marconi.engines.hf.models import (
    ARCHITECTURES,
    Architecture,
    HybridModel,
    architecture,
    load_model,
    tiny_model,
)
from marconi.engines.hf.paged_store import PagedStore, PooledState
from marconi.engines.hf.prefill import Capture, PrefillResult, capture_points, forward, prefill
from marconi.engines.hf.sampling import Sampling, sample
from marconi.engines.hf.state import KVBlock, SSMState, restore, snapshot_kv, snapshot_state
from marconi.engines.hf.tensor_store import KVSource, TensorStore

_kernels.install()  # transformers' four reference-kernel notices: one line of ours

__all__ = [
    "ARCHITECTURES", "Architecture", "Capture", "Engine", "Generation", "HybridModel",
    "KVBlock", "KVSource", "PagedStore", "PooledState", "PrefillResult", "SSMState", "Sampling",
    "TensorStore", "Timings",
    "architecture", "capture_points", "forward", "load_model", "prefill", "restore", "sample",
    "snapshot_kv", "snapshot_state", "tiny_model",
]
