"""Marconi's FLOP-aware eviction inside vLLM 0.32's block pool (docs/integrations.md).

In a deployment whose vLLM environment has marconi installed, one variable turns it on:

    MARCONI_VLLM=marconi MARCONI_MODEL=paper-7b vllm serve ...

vLLM loads every general plugin (entry-point group `vllm.general_plugins`) in each of its
processes, the engine core's included, before it builds the KV cache manager; marconi's
(`plugin`) does nothing unless `MARCONI_VLLM` is set. When it is, `install` puts in:

- **KV no hit can use, first**: vLLM caches every full block a request computed, also
  the blocks past the last state cached on its sequence (its output, mostly), though a
  hit must end at a state: once the request is gone they save no FLOPs, and Marconi's
  tree would not hold them. `KVCacheManager.free` is wrapped to note them (the deepest
  state on the request's sequence is found through vLLM's own hash map), and the pool
  takes them before anything else vLLM would evict (`MARCONI_ORPHANS=keep` leaves them in
  vLLM's order).
- **which Mamba states leave**: `kv_cache_coordinator.BlockPool`, the class every KV cache
  coordinator builds its pool from, becomes `MarconiBlockPool`, a subclass of vLLM's own
  `BlockPool`. vLLM takes new blocks from the head of its free queue (LRU, a finished
  request's tail first), evicting the hash of each cached block it takes. The subclass
  takes as many, and the same KV blocks (orphans aside); only when a block it takes is a
  cached Mamba state does it take, in its place, the free cached state that comes first
  in Marconi's order: one whose KV or other groups' blocks are gone (no hit can use it),
  else the lowest `recency + alpha x efficiency`, both min-max normalized over the
  group's free states, recency the state's rank in the free queue, `efficiency = (F(d) -
  F(p)) / (KV bytes of p..d + state bytes)` for a state after `d` tokens whose nearest
  cached state above was after `p` tokens when it was cached (F the model's prefill
  FLOPs). A state spans one block per Mamba group and serves a hit only whole, so the
  victim is chosen once per state and every group's block of it goes. At alpha 0 the
  states leave in vLLM's order. The blocks are put at the head of the queue and taken by
  vLLM's own `get_new_blocks`.
- **the bootstrap tuner beside the engine**: `KVCacheManager.free` hands a finished
  request's tokens to `Tuning`, which runs a marconi mirror of the cache (system
  `vllm-2026+marconi`: vLLM's admission and block queue as emulated, Marconi's order for
  the states it evicts, the engine's pool; orphan KV is not modelled) and marconi's
  `BootstrapTuner` in a background thread. The alpha it adopts is the engine's from its
  next eviction. `MARCONI_ALPHA` fixes alpha instead (no tuner).
- **or marconi+** (`=marconi+` instead of `=marconi`): marconi+'s shadow experts
  choose the alpha instead, from mirrors at the engine's own order and Marconi's score
  at fixed alphas, never stopping (`integrations.choosers.Shadows`).


Requirements, each checked with a one-line error: vLLM 0.32.x, 0.33.x or 0.34.x; a model
with Mamba layers (checked when the cache is built).

Its modules, by concern: `plugin` (the entry point, the environment's settings), `hooks`
(what it patches in vLLM: `install`, `uninstall`, `split_prefills_on_cpu`), `books` (what
it records: the pool's hooks keeping the states' books, the orphan KV), `pool` (how it
chooses: `MarconiBlockPool`), `order` (how it orders: `StateOrder`), `handover` (how it
hands over to the tuner), `costs` (what the hooks cost: clocks, the log line), `versions`
(the versions supported and what differs between them). `books` and `pool` import vLLM
and are imported by `install`; the rest import in any environment.
"""

from __future__ import annotations

from typing import Any

from marconi.engines.integrations.vllm.costs import REPORT_EVERY
from marconi.engines.integrations.vllm.handover import MIRROR
from marconi.engines.integrations.vllm.hooks import (
    CPU_SPLIT,
    install,
    installed,
    split_prefills_on_cpu,
    uninstall,
)
from marconi.engines.integrations.vllm.order import FEW, StateOrder, first_lowest, flop_scores
from marconi.engines.integrations.vllm.plugin import ENABLE, ORPHANS, TUNER, plugin
from marconi.engines.integrations.vllm.versions import (
    SUPPORTED_VERSIONS,
    WHO,
    block_fields,
    check_version,
    log,
    pool_self,
)

_installed = installed  # what `install` put in, as each plugin module names it

__all__ = [
    "CPU_SPLIT", "ENABLE", "FEW", "MIRROR", "ORPHANS", "REPORT_EVERY", "SUPPORTED_VERSIONS",
    "TUNER", "WHO", "StateOrder", "block_fields", "check_version", "first_lowest",
    "flop_scores", "install", "log", "plugin", "pool_self", "split_prefills_on_cpu",
    "uninstall"]


def __getattr__(name: str) -> Any:
    """`booked`, from `books`, which imports vLLM: loaded when asked (in vLLM's
    environment)."""
    if name == "booked":
        from marconi.engines.integrations.vllm.books import booked

        return booked
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
