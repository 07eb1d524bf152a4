"""Marconi's order as vLLM 0.34's CPU offload cache policy, beside vLLM's `lru` and `arc`.

    .venv/bin/python benchmarks/bench_offload_policy.py [--quick] [--alphas 0,0.5,2]

Needs vLLM 0.34's environment (`bash scripts/setup-peers.sh vllm-0.34`). Replays the
first ShareGPT sessions of at least 10 rounds (paper-7b) through vLLM's own GPU pool
(`KVCacheManager`, 1 GB) with vLLM's own host tier (`CPUOffloadingManager`) beside it,
under each policy: `lru` and `arc` by name, marconi's (`MarconiCachePolicy`) loaded out of
tree by `cache_policy_module_path` at each alpha (`marconi.sim.offload`). Prints per
host size and policy the FLOPs saved, the part of them the host tier's loads saved, the
tokens served from the host, and the tier's stores and evictions.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from common import load

from marconi.core.spec import PAPER_7B
from marconi.engines.real.envs import available
from marconi.sim.offload import replay_offload

GPU = "1GB"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="10 sessions at one host size (CI-sized)")
    parser.add_argument("--alphas", default="0,0.5,2", help="marconi's alphas")
    args = parser.parse_args(argv)
    if not available("vllm-0.34"):
        print("skipped: vLLM 0.34's environment is missing "
              "(bash scripts/setup-peers.sh vllm-0.34)")
        return
    name, hosts = ("sharegpt(10)", ("2GB",)) if args.quick else ("sharegpt(40)",
                                                                 ("2GB", "4GB"))
    trace = load(name)
    assert trace is not None
    policies = ["lru", "arc", *(f"marconi@{a.strip()}" for a in args.alphas.split(","))]
    print(f"{name}: {len(trace)} requests, paper-7b, GPU pool {GPU}")
    print(f"  {'host':>5}  {'policy':12} {'FLOPs saved':>11} {'from host':>9} "
          f"{'host tokens':>11} {'stores':>7} {'evicted':>7} {'s':>5}")
    for host in hosts:
        for policy in policies:
            base, _, alpha = policy.partition("@")
            start = time.perf_counter()
            got = replay_offload(trace, PAPER_7B, GPU, host, base,
                                 alpha=float(alpha) if alpha else None)
            print(f"  {host:>5}  {policy:12} {100 * got.saved_rate:10.2f}% "
                  f"{100 * got.host_flops / got.flops_total:8.2f}% "
                  f"{int(got.host_hit.sum()):11d} {got.meta['stores']:7d} "
                  f"{got.meta['host_evictions']:7d} {time.perf_counter() - start:5.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
