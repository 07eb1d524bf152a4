"""Today's engines as systems: SGLang's and vLLM's hybrid caches, emulated in process or
run as their own code in their own environments (`marconi.engines.real`), each with the
options of the engine flags it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from marconi.core.layout import Layout
from marconi.core.spec import ModelSpec
from marconi.engine_flags import (
    ENGINES,
    SGLANG_CORES,
    SGLANG_DEFAULTS,
    SGLANG_EVICTIONS,
    SGLANG_STRATEGIES,
    VLLM_BLOCK_BASES,
    VLLM_CACHE_MODES,
    VLLM_DEFAULTS,
)
from marconi.systems.paper import bootstrap_once
from marconi.systems.registry import Option, Policies, Settings, System, register_configurable

# --- today's engines (what each models: docs/peers.md) ---------------------------------------
# The emulations (`sglang-2026`, `vllm-2026`) are in-process caches; `sglang-0.5.23` and
# `vllm-0.32` run the engines' real cache code in their own environments
# (scripts/setup-peers.sh), replayed by `marconi.engines.real`; each has the options of the
# engine flags it runs (`--system sglang-0.5.23:strategy=extra_buffer,eviction=lfu`).

def sglang_options(strategies: tuple[str, ...], evictions: tuple[str, ...],
                    pages: tuple[str, ...], real: bool) -> tuple[Option, ...]:
    real_code = "" if real else \
        "the emulation does not model it; sglang-0.5.23 runs SGLang's own code with it"
    out = (
        Option(name="strategy", default=SGLANG_DEFAULTS["strategy"], choices=strategies,
               help="--mamba-radix-cache-strategy: where states are tracked",
               elsewhere=real_code),
        Option(name="eviction", default=SGLANG_DEFAULTS["eviction"], choices=evictions,
               help="--radix-eviction-policy: the KV tree's eviction order",
               elsewhere=real_code),
        Option(name="page_size", default=SGLANG_DEFAULTS["page_size"], kind=int, minimum=1,
               help="--page-size (tokens)")
        if real else Option(name="page_size", default="1", choices=pages,
                            help="--page-size (tokens; the emulation models 1)",
                            elsewhere=real_code),
        Option(name="mamba_full_memory_ratio", default=0.9, kind=float, minimum=0.01,
               help="--mamba-full-memory-ratio: state pool bytes / KV pool bytes"),
        Option(name="chunked_prefill_size", default=SGLANG_DEFAULTS["chunked_prefill_size"],
               kind=int, minimum=1,
               help="--chunked-prefill-size: the longest prefill chunk (tokens)"),
    )
    core = Option(name="core", default=SGLANG_DEFAULTS["core"], choices=SGLANG_CORES,
                  help="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: the tree's implementation")
    return (*out, core, *integration_options("SGLang", "sglang", " (needs core=python)")) \
        if real else out


def integration_options(engine: str, module: str, needs: str = "") -> tuple[Option, ...]:
    """The options of a real-engine system that installs marconi's integration."""
    return (
        Option(name="integration", default="none",
               help=f"installed in {engine}'s own cache (marconi.engines.integrations.{module}): "
                    f"Marconi's eviction and bootstrap tuner (marconi), marconi+'s "
                    f"shadow experts choosing among the orders it can run (marconi+), or "
                    f"a system whose eviction is a declared priority (lfu, slru), "
                    f"evaluated as the engine's own order{needs}"),
        Option(name="tuner", default="thread", choices=("thread", "inline"),
               help="the integration's tuner: in its own thread (as deployed) or inline "
                    "(reproducible)"))


def environment(system: str) -> str:
    """The engine environment (`engine_flags.ENGINES`) whose real code runs `system`."""
    for key, engine in ENGINES.items():
        if engine.system == system:
            return key
    raise ValueError(f"no engine environment runs {system!r} (engine_flags.ENGINES)")


def sglang_config(settings: Settings) -> object:
    from marconi.peers.mamba_radix import BufferMode, SGLangConfig

    ratio = float(settings["mamba_full_memory_ratio"])  # type: ignore[arg-type]
    return SGLangConfig(mode=BufferMode(str(settings["strategy"]).replace("_", "-")),
                        chunk=int(settings["chunked_prefill_size"]),  # type: ignore[call-overload]
                        state_share=ratio / (1.0 + ratio))


def sglang(name: str, description: str, settings: Settings, real: bool) -> System:
    """SGLang's hybrid cache with `settings` (the emulation, or the real code's entry)."""

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_radix import MambaRadix, MambaRadixLRU

        if real:
            raise ValueError(f"{name} runs SGLang's own cache code in its environment, "
                             "not in this process (sglang-2026 is its in-process emulation)")
        config = sglang_config(settings)
        return MambaRadix(config), MambaRadixLRU(config)  # type: ignore[arg-type]

    def layout(spec: ModelSpec, capacity: int) -> Layout:
        from marconi.peers.mamba_radix import sglang_layout

        return sglang_layout(spec, capacity, sglang_config(settings))  # type: ignore[arg-type]

    def memory(spec: ModelSpec, capacity: int) -> tuple[ModelSpec, int]:
        from marconi.peers.mamba_radix import sglang_memory

        return sglang_memory(spec, capacity)

    return System(name=name, policies=policies, description=description, engine_layout=layout,
                  engine_memory=memory, engine=environment(name) if real else None,
                  visibility="chunk", chunk_tokens=int(settings["chunked_prefill_size"]))  # type: ignore[call-overload]


def _sglang_marconi(name: str, description: str, settings: Settings, real: bool) -> System:
    """SGLang's admission and layout with Marconi's eviction and tuner: what
    marconi.engines.integrations.sglang puts into SGLang, emulated (its tuner's mirror)."""
    base = sglang(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.eviction import MARCONI
        from marconi.peers.mamba_radix import MambaRadix, MambaRadixFlop

        config = sglang_config(settings)
        return (MambaRadix(config),  # type: ignore[arg-type]
                MambaRadixFlop(config, spec, alpha, score=MARCONI))  # type: ignore[arg-type]

    return replace(base, policies=policies, tuner=bootstrap_once, uses_alpha=True)


def _vllm_options(real: bool = False, version: str = "0.32") -> tuple[Option, ...]:
    """The options of a vLLM system. `default_block_size` is where the derived block size
    starts: the emulation's says which version it follows, a real engine's is its own
    (one choice: `version`'s)."""
    own = "64" if version == "0.34" else "16"
    mode = Option(name="mamba_cache_mode", default=VLLM_DEFAULTS["mamba_cache_mode"],
                  choices=VLLM_CACHE_MODES,
                  help="--mamba-cache-mode: where states are cached (0.32 has align only; "
                       "0.34 ignores the flag: align whenever prefix caching is on)")
    base = Option(name="default_block_size",
                  default=own if real else str(VLLM_DEFAULTS["default_block_size"]),
                  choices=(own,) if real else VLLM_BLOCK_BASES,
                  help="vLLM's CacheConfig.DEFAULT_BLOCK_SIZE, where the derived block size "
                       "starts (block_size=none): 16 as vLLM 0.32 and 0.33, 64 as 0.34",
                  elsewhere=f"vllm-{version} runs its own" if real else "")
    return mode, base, *(
        Option(name="block_size", default=VLLM_DEFAULTS["block_size"], kind=int, minimum=1,
               optional=True,
               help="--block-size (tokens); none: derived from the model as vLLM does"),
        Option(name="max_num_batched_tokens", default=VLLM_DEFAULTS["max_num_batched_tokens"],
               kind=int, minimum=1,
               help="--max-num-batched-tokens: the longest prefill step"),
        Option(name="retention_interval", default=VLLM_DEFAULTS["retention_interval"], kind=int,
               minimum=0, optional=True,
               help="--prefix-cache-retention-interval (tokens): 0 keeps only reusable "
                    "boundaries, R one state per R tokens, none every block's"),
    ), *((*integration_options("vLLM", "vllm"),
          Option(name="orphans", default="first", choices=("first", "keep"),
                 help="with integration=marconi: cached KV past a request's last state "
                      "evicted before anything else (first) or left in vLLM's order "
                      "(keep, an ablation)"))
         if real else ())


def _vllm_config(settings: Settings) -> object:
    from marconi.peers.mamba_align import VLLMConfig

    block, retention = settings["block_size"], settings["retention_interval"]
    return VLLMConfig(block=None if block is None else int(block),  # type: ignore[call-overload]
                      chunk=int(settings["max_num_batched_tokens"]),  # type: ignore[call-overload]
                      retention=None if retention is None else int(retention),  # type: ignore[call-overload]
                      base=int(settings["default_block_size"]))  # type: ignore[call-overload]


def _vllm(name: str, description: str, settings: Settings, real: bool) -> System:
    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.peers.mamba_align import Align, BlockLRU

        if real:
            raise ValueError(f"{name} runs vLLM's own cache code in its environment, "
                             "not in this process (vllm-2026 is its in-process emulation)")
        return Align(_vllm_config(settings)), BlockLRU()  # type: ignore[arg-type]

    def layout(spec: ModelSpec, capacity: int) -> Layout:
        from marconi.peers.mamba_align import vllm_layout

        return vllm_layout(spec, capacity, _vllm_config(settings))  # type: ignore[arg-type]

    def memory(spec: ModelSpec, capacity: int) -> tuple[ModelSpec, int]:
        from marconi.peers.mamba_align import vllm_memory

        return vllm_memory(spec, capacity, _vllm_config(settings))  # type: ignore[arg-type]

    return System(name=name, policies=policies, description=description, engine_layout=layout,
                  engine_memory=memory, engine=environment(name) if real else None,
                  visibility="block", chunk_tokens=int(settings["max_num_batched_tokens"]))  # type: ignore[call-overload]


def _vllm_marconi(name: str, description: str, settings: Settings, real: bool) -> System:
    """vLLM's admission and layout with Marconi's order for states: what
    marconi.engines.integrations.vllm puts into vLLM, emulated (its tuner's mirror)."""
    base = _vllm(name, description, settings, real)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        from marconi.paper.eviction import MARCONI
        from marconi.peers.mamba_align import Align, BlockFlop

        return (Align(_vllm_config(settings)),  # type: ignore[arg-type]
                BlockFlop(spec, alpha, score=MARCONI))

    return replace(base, policies=policies, tuner=bootstrap_once, uses_alpha=True)


def peer(name: str, description: str, make: Callable[[str, str, Settings, bool], System],
          options: tuple[Option, ...], real: bool, **fixed: object) -> None:
    """Register `name`, made by `make(name, description, settings, real)` with `fixed`
    settings on top of the user's."""

    def configure(settings: Settings) -> System:
        return make(name, description, {**settings, **fixed}, real)

    register_configurable(name, options, configure)


peer("sglang-2026", "SGLang emulation (no-buffer): states at chunk, prefill and request "
      "ends; KV and state LRU lists; its layout: a state pool beside the KV", sglang,
      sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",), real=False), False)
peer("sglang-2026-extra", "SGLang emulation (extra-buffer): 64-aligned chunk and branch "
      "states; its layout: a state pool beside the KV", sglang,
      tuple(o for o in sglang_options((), ("lru",), ("1",), real=False)
            if o.name != "strategy"), False, strategy="extra_buffer")
peer("sglang-2026+marconi", "SGLang emulation with Marconi's FLOP-aware eviction and "
      "bootstrap tuner (what marconi.engines.integrations.sglang installs); its layout: a state "
      "pool beside the KV", _sglang_marconi,
      sglang_options(("no_buffer", "extra_buffer"), ("lru",), ("1",), real=False), False)
peer("vllm-2026", "vLLM emulation (align mode): block-aligned states, shared-prefix "
      "junctions, block LRU; its layout: KV in pages of its block size", _vllm,
      _vllm_options(), False)
peer("vllm-2026+marconi", "vLLM emulation with Marconi's order for the states its block "
      "queue evicts and the bootstrap tuner (what marconi.engines.integrations.vllm installs); its "
      "layout: KV in pages of its block size", _vllm_marconi, _vllm_options(), False)
peer("sglang-0.5.23", "SGLang 0.5.23's own UnifiedRadixCache, replayed in its environment "
      "(scripts/setup-peers.sh)", sglang,
      sglang_options(SGLANG_STRATEGIES, SGLANG_EVICTIONS, ("1",), real=True), True)
peer("vllm-0.32", "vLLM 0.32's own KVCacheManager, replayed in its environment "
      "(scripts/setup-peers.sh)", _vllm, _vllm_options(real=True), True)
peer("vllm-0.33", "vLLM 0.33's own KVCacheManager (from its GPU wheel: cache classes only, "
      "no CPU build exists), replayed in its environment (scripts/setup-peers.sh)", _vllm,
      _vllm_options(real=True, version="0.33"), True)
# 0.34: the block size derived from 64; --mamba-cache-mode a no-op (align with prefix caching)
peer("vllm-0.34", "vLLM 0.34's own KVCacheManager (from its GPU wheel: cache classes only, "
      "no CPU build exists), replayed in its environment (scripts/setup-peers.sh)", _vllm,
      _vllm_options(real=True, version="0.34"), True)
