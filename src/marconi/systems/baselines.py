"""Other baselines (what each models: docs/peers.md, "Other baselines"): SegLen, T-LRU,
LFU, SLRU, llama.cpp's context checkpoints, sparse prefix caching."""

from __future__ import annotations

from dataclasses import replace

from marconi.core.spec import ModelSpec
from marconi.systems.engines import peer, sglang, sglang_config, sglang_options
from marconi.systems.registry import (
    UNBOUNDED_PLANNER,
    Option,
    Policies,
    Settings,
    System,
    register_configurable,
    system,
)


def _seglen(settings: Settings) -> System:
    weight = float(settings["weight"])  # type: ignore[arg-type]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.admission import Judicious
        from marconi.peers.seglen import SegLen

        return Judicious(), SegLen(weight)

    return System(name="seglen", policies=policies,
                  description="judicious admission; eviction by recency + weight x replay "
                              "length to the nearest state above (SegLen, SGLang's proposal)")


register_configurable("seglen", (
    Option(name="weight", default=0.85, kind=float, minimum=0.0,
           help="--seglen-eff-weight: the replay length's weight beside recency"),), _seglen)


def _tlru(name: str, description: str, settings: Settings, real: bool) -> System:
    """`sglang-2026` with its KV list in T-LRU order (SGLang's `tlru` strategy)."""
    threshold = int(settings["threshold"])  # type: ignore[call-overload]
    estimate = int(settings["next_prompt_estimate"])  # type: ignore[call-overload]
    if threshold <= estimate:
        raise ValueError(f"system {name}: threshold ({threshold}) must exceed "
                         f"next_prompt_estimate ({estimate}), as SGLang requires; otherwise "
                         "no token is ever TEL-safe and T-LRU is LRU (sglang-2026)")
    base = sglang(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_radix import MambaRadix
        from marconi.peers.tlru import TailLRU

        config = sglang_config(settings)
        return MambaRadix(config), TailLRU(config, threshold=threshold,  # type: ignore[arg-type]
                                           next_prompt=estimate)

    return replace(base, policies=policies)


peer("tlru", "SGLang emulation with tail-optimized LRU for its KV (--radix-eviction-policy "
      "tlru): a conversation's KV past what keeps its next prefill within threshold tokens "
      "leaves first, then LRU", _tlru,
      (*(o for o in sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",),
                                    real=False) if o.name != "eviction"),
       Option(name="threshold", default=4096, kind=int, minimum=0,
              help="--radix-eviction-policy-config threshold: the tokens a next prefill "
                   "may compute within its TTFT budget"),
       Option(name="next_prompt_estimate", default=512, kind=int, minimum=0,
              help="--radix-eviction-policy-config next_prompt_estimate: the tokens a "
                   "next prompt is expected to add")), False)


@system("lfu", "judicious admission; leaves least frequently used first (hit count, then "
        "recency: SGLang's --radix-eviction-policy lfu), a declared priority")
def _lfu(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.core.ranked import Ranked
    from marconi.paper.admission import Judicious
    from marconi.peers.lfu import LFU

    return Judicious(), Ranked(LFU)


@system("slru", "judicious admission; leaves hit fewer than twice before the others, each "
        "least recently used first (SGLang's --radix-eviction-policy slru), a declared "
        "priority")
def _slru(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.core.ranked import Ranked
    from marconi.paper.admission import Judicious
    from marconi.peers.slru import SLRU

    return Judicious(), Ranked(SLRU)


def _llamacpp(settings: Settings) -> System:
    checkpoints = int(settings["ctx_checkpoints"])  # type: ignore[call-overload]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.llamacpp import ContextCheckpoints, SlotBook, SlotFIFO

        book = SlotBook()
        return ContextCheckpoints(book), SlotFIFO(book, checkpoints)

    return System(name="llamacpp-2026", policies=policies,
                  description="llama.cpp server slots (one per session) with context "
                              "checkpoints: the longest of the slot's own checkpoints and "
                              "live state, newest N checkpoints kept")


register_configurable("llamacpp-2026", (
    Option(name="ctx_checkpoints", default=32, kind=int, minimum=1,
           help="--ctx-checkpoints: checkpoints a slot keeps (oldest dropped first)"),),
    _llamacpp)


def _sparse_prefix(settings: Settings) -> System:
    budget = int(settings["budget"])  # type: ignore[call-overload]

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.eviction import LRULeaf
        from marconi.peers.sparse_prefix import SparsePrefix

        return SparsePrefix(budget), LRULeaf()

    return System(name="sparse-prefix", policies=policies,
                  description="sparse prefix caching: per input at most `budget` states, "
                              "placed by a dynamic program over the overlap depths seen so "
                              "far; LRU over leaves", unbounded=UNBOUNDED_PLANNER)


register_configurable("sparse-prefix", (
    Option(name="budget", default=4, kind=int, minimum=1,
           help="checkpoints a sequence may hold (the placement's budget)"),), _sparse_prefix)
