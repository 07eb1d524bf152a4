"""vLLM 0.34's CPU offload tier beside its GPU pool, replayed with a cache policy of
vLLM's (`lru`, `arc`) or marconi's (`marconi`: `integrations.vllm_offload`, loaded by
vLLM's own `CachePolicyFactory` from its module path): `vllm_offload_worker.py` in vLLM
0.34's environment (`engines/real/vllm_offload_worker.py`), and what it served
(docs/integrations.md, "Marconi as vLLM's offload cache policy")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marconi.core.scores import FlopsAt
from marconi.core.spec import ModelSpec
from marconi.core.units import parse_size
from marconi.engine_flags import ENGINES, Engine
from marconi.engines.real.worker import run_worker
from marconi.sim.real_engine import model_options
from marconi.workload.types import Request

POLICIES = ("lru", "arc", "marconi")  # vLLM's two built-in policies, and marconi's
MODULE = "marconi.engines.integrations.vllm_offload"  # cache_policy_module_path
CLASS = "MarconiCachePolicy"  # eviction_policy
# vLLM 0.34's environment, its offload worker beside the cache worker
WORKER = Engine(name=ENGINES["vllm-0.34"].name, version=ENGINES["vllm-0.34"].version,
                system="vllm-0.34 (offload tier)", kind="vllm_offload")


@dataclass(frozen=True, slots=True)
class Served:
    """One replay: per request the hit, the part the GPU pool served and the part loaded
    from the host tier; the FLOPs they save; the tier's meta."""

    policy: str
    hit: np.ndarray
    gpu_hit: np.ndarray
    host_hit: np.ndarray
    flops_saved: float  # prefill FLOPs of every hit
    flops_total: float  # prefill FLOPs of every input
    host_flops: float  # the part of `flops_saved` the host tier's loads saved
    meta: dict[str, Any]

    @property
    def saved_rate(self) -> float:
        return self.flops_saved / self.flops_total if self.flops_total else 0.0


def replay_offload(requests: Sequence[Request], spec: ModelSpec, gpu: int | str,
                   host: int | str, policy: str, *, alpha: float | None = None,
                   progress: bool = False) -> Served:
    """`requests` through vLLM 0.34's GPU pool of `gpu` bytes and its host tier of `host`
    bytes under `policy` (one of `POLICIES`; marconi's with `alpha`, default its own)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown offload policy {policy!r} (known: {', '.join(POLICIES)})")
    ours = policy == "marconi"
    env = {"MARCONI_MODEL": spec.name} if ours else {}
    if ours and alpha is not None:
        env["MARCONI_ALPHA"] = repr(float(alpha))
    options = {**model_options(spec), "memory_bytes": parse_size(gpu),
               "default_block_size": 64, "progress_every": 100,
               "offload": {"host_bytes": parse_size(host), "env": env,
                           "policy": CLASS if ours else policy,
                           "module_path": MODULE if ours else None,
                           "src": str(Path(__file__).resolve().parents[2]) if ours else None}}
    columns, meta = run_worker(WORKER, requests, options, progress=progress,
                               label=f"vllm-0.34 offload {policy}")
    f = FlopsAt(spec)
    hit, gpu_hit = columns["hit"], columns["gpu_hit"]
    saved = sum(f(int(h)) for h in hit)
    from_host = saved - sum(f(int(h)) for h in gpu_hit)
    total = sum(f(int(r.n_input)) for r in requests)
    return Served(policy=policy, hit=hit, gpu_hit=gpu_hit, host_hit=columns["host_hit"],
                  flops_saved=saved, flops_total=total, host_flops=from_host,
                  meta=meta)
