"""Marconi inside the engines' real cache code: FLOPs saved against the stock engine.

    .venv/bin/python benchmarks/bench_integrations.py [--quick]

Needs the engines' environments (`bash scripts/setup-peers.sh`); an engine whose
environment is missing is skipped with one line. Replays ShareGPT, the agent trajectories
and the Mooncake conversation trace (both from ../shared/data, skipped when absent) at
three capacities each, model paper-7b, one request at a time, through each stock engine
(`sglang-0.5.23`, its UnifiedRadixCache with the Python tree core; `vllm-0.32`, its
KVCacheManager) and through the same code with Marconi's eviction installed
(`integration=marconi`: marconi.engines.integrations.sglang and .vllm) and with
marconi+'s shadow experts choosing the order (`integration=marconi+`), the tuner inline so
that the figures are reproducible (deployed, it runs in its own thread); `--only` runs
some of these beside each stock engine. Prints per configuration both FLOPs-saved rates
and their ratio, then one line per integration

    integration sglang-0.5.23+marconi vs sglang-0.5.23: 9 configs, FLOPs saved ratio min
    1.031 mean 1.142   (one line)

(a configuration where the stock engine saved nothing counts as ratio 1 when both saved
nothing and is left out of min and mean otherwise, said on the line), and the
integration's added cost per request: in the scheduling loop (ordering the eviction
walk's candidates) and beside it (the tuner's mirror and replays). `--quick`: 40 ShareGPT
sessions at two capacities that evict (CI-sized). `sglang-0.5.23[ratio=0.05]` is SGLang
deployed with a small state pool (`--mamba-full-memory-ratio 0.05`), on the agent
trajectories only, where its state pool fills before its KV pool (not under `--quick`).
`sglang-0.5.23[lfu]`, `vllm-0.32[lfu]` and so on for every registered system whose eviction
is a declared priority: the plugin asked for it by name (`integration=lfu`) against
SGLang's own strategy of that name (the same policy: ratio 1.000) or stock vLLM.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

from common import load

from marconi.core.spec import PAPER_7B
from marconi.engines.real.envs import available
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.workload import Trace


@dataclass(frozen=True)
class Setup:
    """A stock engine (its system) and the same engine with integrations installed."""

    stock: str
    integrations: dict[str, str]  # label -> system
    plan: dict[str, tuple[str, ...]] | None = None  # its own traces (None: FULL or QUICK)
    quick: bool = True  # run under --quick


SMALL_POOL = "sglang-0.5.23:mamba_full_memory_ratio=0.05"
ENGINES = {
    "sglang-0.5.23": Setup("sglang-0.5.23", {
        "sglang-0.5.23+marconi": "sglang-0.5.23:integration=marconi,tuner=inline",
        "sglang-0.5.23+marconi+": "sglang-0.5.23:integration=marconi+,tuner=inline"}),
    "vllm-0.32": Setup("vllm-0.32", {
        "vllm-0.32+marconi": "vllm-0.32:integration=marconi,tuner=inline",
        "vllm-0.32+marconi+": "vllm-0.32:integration=marconi+,tuner=inline",
        # the ablation: Marconi's state order alone, orphan KV left in vLLM's order
        "vllm-0.32+marconi[orphans=keep]":
            "vllm-0.32:integration=marconi,tuner=inline,orphans=keep"}),
    # SGLang deployed with a small state pool (--mamba-full-memory-ratio 0.05: state
    # slots worth a twentieth of the KV pool's bytes), where the agent trajectories fill
    # the state pool first and the order of the Mamba walk decides what stays
    "sglang-0.5.23[ratio=0.05]": Setup(SMALL_POOL, {
        "sglang-0.5.23[ratio=0.05]+marconi": f"{SMALL_POOL},integration=marconi,tuner=inline",
        "sglang-0.5.23[ratio=0.05]+marconi+":
            f"{SMALL_POOL},integration=marconi+,tuner=inline"},
        plan={"swe-agent": ("20GB", "40GB", "60GB")}, quick=False),
}


def declared_setups() -> dict[str, Setup]:
    """Each registered system whose eviction is a declared priority (`lfu`, `slru`),
    evaluated inside each engine by its plugin (`integration=NAME`): in SGLang as the
    eviction strategy of its name, against SGLang's own strategy of that name where SGLang
    ships one (ratio 1.000 and identical hits: the declaration is SGLang's policy), else
    against stock; in vLLM as the order of its Mamba states, against stock vLLM."""
    from marconi.engine_flags import SGLANG_EVICTIONS
    from marconi.engines.integrations.common import declared_priorities

    out = {}
    for name in declared_priorities():
        sglang = f"sglang-0.5.23:eviction={name}" if name in SGLANG_EVICTIONS else "sglang-0.5.23"
        out[f"sglang-0.5.23[{name}]"] = Setup(sglang, {
            f"sglang-0.5.23+{name}": f"sglang-0.5.23:integration={name}"})
        out[f"vllm-0.32[{name}]"] = Setup("vllm-0.32", {
            f"vllm-0.32+{name}": f"vllm-0.32:integration={name}"})
    return out


ENGINES.update(declared_setups())
FULL: dict[str, tuple[str, ...]] = {
    "sharegpt": ("2GB", "5GB", "10GB"), "swe-agent": ("20GB", "40GB", "60GB"),
    "mooncake[0:1000]": ("20GB", "40GB", "60GB")}
QUICK: dict[str, tuple[str, ...]] = {"sharegpt(40)": ("1GB", "2GB")}


def ratio(ours: float, stock: float) -> float:
    if stock > 0:
        return ours / stock
    return 1.0 if ours == 0 else math.inf


def summary_line(label: str, stock: str, ratios: list[float]) -> str:
    finite = [r for r in ratios if math.isfinite(r)]
    left = len(ratios) - len(finite)
    note = f" ({left} where {stock} saved nothing left out)" if left else ""
    if not finite:
        return f"integration {label} vs {stock}: {len(ratios)} configs, no finite ratio{note}"
    return (f"integration {label} vs {stock}: {len(ratios)} configs, FLOPs saved ratio min "
            f"{min(finite):.3f} mean {sum(finite) / len(finite):.3f}{note}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a CI-sized subset")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--only", default=None,
                        help="comma-separated integration labels to run beside each stock "
                             "engine (default: all of them), e.g. sglang-0.5.23+marconi+")
    parser.add_argument("--emulated-splits", action="store_true",
                        help="only the emulation (the integration's mirror) of SGLang on "
                             "the agent trajectories at 20 GB over memory splits "
                             f"({', '.join(SPLITS)}), stock and with Marconi's eviction")
    args = parser.parse_args(argv)
    if args.emulated_splits:
        emulated_splits()
        return
    plan = QUICK if args.quick else FULL
    only = None if args.only is None else set(args.only.split(","))
    known = {label for setup in ENGINES.values() for label in setup.integrations}
    if only is not None and not only <= known:
        parser.error(f"--only: unknown label(s) {', '.join(sorted(only - known))} "
                     f"(known: {', '.join(sorted(known))})")
    for name in args.engines.split(","):
        if name not in ENGINES:
            parser.error(f"--engines: unknown engine {name!r} (known: {', '.join(ENGINES)})")
    for name in args.engines.split(","):
        setup = ENGINES[name]
        engine = name.split("-")[0]
        if not available(engine):
            print(f"{name}: skipped, its environment is missing "
                  f"(bash scripts/setup-peers.sh {engine})")
            continue
        if args.quick and not setup.quick:
            print(f"{name}: skipped under --quick")
            continue
        systems = {label: system for label, system in setup.integrations.items()
                   if only is None or label in only}
        if systems:
            bench_engine(name, setup.stock, systems, setup.plan or plan)


def bench_engine(stock_name: str, stock_system: str, systems: dict[str, str],
                 plan: dict[str, tuple[str, ...]]) -> None:
    """Every configuration of `plan` through the stock engine and each integration."""
    ratios: dict[str, list[float]] = {label: [] for label in systems}
    loop_ns: dict[str, float] = dict.fromkeys(systems, 0.0)
    beside_ns: dict[str, float] = dict.fromkeys(systems, 0.0)
    served: dict[str, int] = dict.fromkeys(systems, 0)
    print(f"{stock_name}, per configuration: FLOPs saved (stock, with marconi), ratio, "
          "tuned alpha, requests, system")
    for name, capacities in plan.items():
        trace = load(name)
        if trace is None:
            print(f"  {name}: data absent, skipped")
            continue
        for capacity in capacities:
            stock = replay(trace, capacity, stock_system)
            for label, system in systems.items():
                ours = replay(trace, capacity, system)
                r = ratio(ours["flops_saved"], stock["flops_saved"])
                ratios[label].append(r)
                hook = ours["engine"]["integration"]
                loop_ns[label] += hook["order_ns"] + hook["feed_ns"]
                beside_ns[label] += hook["tuner_ns"]
                served[label] += len(trace)
                alpha = "untuned" if ours["alpha"] is None else f"{ours['alpha']:g}"
                print(f"  {name:18} {capacity:>5}  {100 * stock['flops_saved_rate']:6.2f}%  "
                      f"{100 * ours['flops_saved_rate']:6.2f}%  ratio {r:6.3f}  "
                      f"alpha {alpha:>7}  {len(trace)} requests  {label}", flush=True)
    for label in systems:
        print(summary_line(label, stock_name, ratios[label]))
        n = max(served[label], 1)
        print(f"integration {label}: added cost per request {loop_ns[label] / n / 1e3:.0f} us "
              f"in the scheduling loop (ordering eviction candidates), "
              f"{beside_ns[label] / n / 1e3:.0f} us beside it (the tuner's mirror and "
              "replays, a thread when deployed)")


SPLITS = ("0.9", "0.1", "0.05")  # --mamba-full-memory-ratio: SGLang's default, smaller


def emulated_splits(capacity: str = "20GB") -> None:
    """How SGLang's split of memory between its KV and state pools moves what stock and
    Marconi's eviction save on the agent trajectories, in the emulation (`sglang-2026`,
    and `sglang-2026+marconi` with its bootstrap tuner: the integration's mirror)."""
    trace = load("swe-agent")
    if trace is None:
        print("swe-agent: data absent, skipped")
        return
    print(f"emulated SGLang on swe-agent at {capacity}, FLOPs saved by memory split: "
          "stock, with marconi (tuned alpha)")
    for split in SPLITS:
        option = f"mamba_full_memory_ratio={split}"
        stock = replay(trace, capacity, f"sglang-2026:{option}")
        ours = replay(trace, capacity, f"sglang-2026+marconi:{option}")
        alpha = "untuned" if ours["alpha"] is None else f"{ours['alpha']:g}"
        print(f"  ratio {split:>4}  {100 * stock['flops_saved_rate']:6.2f}%  "
              f"{100 * ours['flops_saved_rate']:6.2f}%  (alpha {alpha})", flush=True)


def replay(trace: Trace, capacity: str, system: str) -> dict:
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, bounds=False,
                       # the figures recorded in benchmarks/RESULTS.md
                       replay="sequential", retune=False)
    return run(trace, config, warn=False).summary().to_json()


if __name__ == "__main__":
    main()
