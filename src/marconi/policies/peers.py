"""Today's engines as named systems (DESIGN section 5), so every comparison has them.

- `sglang-2026`: SGLang's `MambaRadixCache`, no-buffer mode (its default for Mamba2);
- `sglang-2026-extra`: the same with `--mamba-scheduler-strategy extra_buffer`;
- `vllm-2026`: vLLM v1, `--enable-prefix-caching --mamba-cache-mode align`.

What each models, and what it does not, is in docs/peers.md.
"""

from __future__ import annotations

from marconi.policies import System, register
from marconi.policies.mamba_align import Align, BlockLRU
from marconi.policies.mamba_radix import BufferMode, MambaRadix, MambaRadixLRU, SGLangConfig

EXTRA = SGLangConfig(mode=BufferMode.EXTRA_BUFFER)

SGLANG_2026 = register(System(
    name="sglang-2026", admission=MambaRadix, eviction=lambda spec, alpha: MambaRadixLRU(),
    description="SGLang MambaRadixCache (no-buffer): states at chunk, prefill and request "
                "ends; KV and state LRU lists"))
SGLANG_2026_EXTRA = register(System(
    name="sglang-2026-extra", admission=lambda: MambaRadix(EXTRA),
    eviction=lambda spec, alpha: MambaRadixLRU(EXTRA),
    description="SGLang MambaRadixCache (extra-buffer): 64-aligned chunk and branch states"))
VLLM_2026 = register(System(
    name="vllm-2026", admission=Align, eviction=lambda spec, alpha: BlockLRU(),
    description="vLLM v1 align mode: block-aligned states, shared-prefix junctions, "
                "block LRU"))
