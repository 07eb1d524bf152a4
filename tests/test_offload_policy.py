"""Marconi's order as vLLM's CPU offload cache policy (marconi.engines.integrations.vllm_offload),
loaded by vLLM 0.34's own `CachePolicyFactory` from `cache_policy_module_path` and driven
by its own `CPUOffloadingManager`, with no patch to vLLM.

Needs vLLM 0.34's environment (`bash scripts/setup-peers.sh vllm-0.34`): skipped without
it, except under CI, where it fails (tests/test_realpeers.py `need`)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from marconi.core.spec import PAPER_7B
from marconi.engines.real.envs import envs_dir
from marconi.workload import TraceOptions, load_trace
from tests.test_realpeers import need

ROOT = Path(__file__).resolve().parents[1]

# run in vLLM 0.34's environment: vLLM's manager with each policy, fed the same requests
THROUGH_VLLM = textwrap.dedent('''
    import os, random, sys
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    MODULE, NAME = "marconi.engines.integrations.vllm_offload", "MarconiCachePolicy"

    def manager(policy, chunks):
        if policy == "lru":
            return CPUOffloadingManager(num_chunks=chunks, cache_policy="lru")
        return CPUOffloadingManager(num_chunks=chunks, cache_policy=NAME,
                                    cache_policy_module_path=MODULE)

    def request(tier, rid, keys_at, load=()):
        """A request: its keys' end positions, what it loads, what it stores."""
        ctx = ReqContext(req_id=rid)
        tier.on_new_request(ctx)
        for key, end in keys_at:
            ctx.set_offload_key_position(key, end)
        if load:
            tier.prepare_load(list(load), ctx)
            tier.complete_load(list(load), ctx)
        out = tier.prepare_store([k for k, _ in keys_at], ctx)
        if out is not None:
            tier.complete_store(out.keys_to_store, ctx)
        tier.on_request_finished(ctx)
        return [] if out is None else out.evicted_keys

    assert CachePolicyFactory.get_cache_policy_cls(NAME, MODULE).__name__ == NAME

    # 1. at alpha 0, with every chunk usable (one group), exactly vLLM's lru, on random
    #    requests over shared prefixes, each loading what the tier holds of its prefix
    os.environ["MARCONI_ALPHA"] = "0"
    rng = random.Random(7)
    tiers = {p: manager(p, 24) for p in ("lru", "marconi")}
    evicted = {p: [] for p in tiers}
    for r in range(300):
        stem, depth = rng.randrange(6), rng.randrange(1, 9)
        keys_at = [(make_offload_key(bytes([stem, j, r % 5 if j > 3 else 0]), 0), 16 * (j + 1))
                   for j in range(depth)]
        for policy, tier in tiers.items():
            held = [k for k, _ in keys_at if tier._policy.get(k) is not None
                    and tier._policy.get(k).is_ready]
            evicted[policy].append(request(tier, str(r), keys_at, held))
    assert evicted["lru"] == evicted["marconi"], "alpha 0 differs from lru"
    assert sum(map(len, evicted["lru"])) > 50

    # 2. KV past the request's deepest state (group 1 holds states) leaves first, though
    #    more recent than the other chunks
    os.environ["MARCONI_ALPHA"] = "2"
    tier = manager("marconi", 6)
    old = [(make_offload_key(bytes([9, j]), 0), 16 * (j + 1)) for j in range(3)]
    old += [(make_offload_key(bytes([9, 2]), 1), 48)]  # a state at 48: all of `old` usable
    request(tier, "old", old)
    new = [(make_offload_key(bytes([8, j]), 0), 16 * (j + 1)) for j in range(2)]
    new += [(make_offload_key(bytes([8, 0]), 1), 16)]  # a state at 16: KV at 32 unusable
    gone = request(tier, "new", new)
    assert gone == [make_offload_key(bytes([9, 2]), 0)], gone  # full: old's tail, as lru
    third = [(make_offload_key(bytes([7, 0]), 0), 16)]
    gone = request(tier, "third", third)
    # lru would take old's next tail; the unusable KV goes first, though more recent
    assert gone == [make_offload_key(bytes([8, 1]), 0)], gone
    print("ok")
''')


def _python() -> Path:
    return envs_dir() / "vllm-0.34" / "bin" / "python"


def test_loaded_by_vllms_factory_its_order_through_vllms_manager() -> None:
    """vLLM's factory loads the policy by module path; through vLLM's manager it evicts
    exactly as vLLM's `lru` at alpha 0, and takes KV past the deepest state first."""
    need("vllm-0.34")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MARCONI_MODEL": "paper-7b"}
    done = subprocess.run([str(_python()), "-c", THROUGH_VLLM], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_missing_model_is_one_line() -> None:
    need("vllm-0.34")
    code = ("import os; os.environ['VLLM_TARGET_DEVICE'] = 'cpu'\n"
            "from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager\n"
            "CPUOffloadingManager(num_chunks=4, cache_policy='MarconiCachePolicy', "
            "cache_policy_module_path='marconi.engines.integrations.vllm_offload')\n")
    env = {k: v for k, v in os.environ.items() if k != "MARCONI_MODEL"}
    done = subprocess.run([str(_python()), "-c", code], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT / "src")}, timeout=300)
    assert done.returncode != 0
    assert "MarconiCachePolicy needs MARCONI_MODEL" in done.stderr


def test_a_trace_served_by_the_gpu_pool_and_the_host_tier() -> None:
    """ShareGPT through vLLM 0.34's GPU pool and host tier with marconi's policy: the
    host tier serves tokens the GPU pool no longer holds, every hit is at least the GPU
    pool's, and the FLOPs saved count both."""
    need("vllm-0.34")
    from marconi.sim.offload import replay_offload

    trace = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=10))
    got = replay_offload(trace, PAPER_7B, "1GB", "2GB", "marconi", alpha=0.5)
    assert got.meta["policy"] == "marconi.engines.integrations.vllm_offload.MarconiCachePolicy"
    assert got.meta["host_evictions"] > 0 and got.host_hit.sum() > 0
    assert (got.hit >= got.gpu_hit).all() and (got.hit == got.gpu_hit + got.host_hit).all()
    assert 0 < got.host_flops < got.flops_saved <= got.flops_total
    with pytest.raises(ValueError, match="unknown offload policy 'fifo'"):
        replay_offload(trace, PAPER_7B, "1GB", "2GB", "fifo")
