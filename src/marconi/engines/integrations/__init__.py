"""Marconi's eviction inside the engines people run (docs/integrations.md).

`marconi.engines.integrations.sglang` installs Marconi's FLOP-aware eviction, with its bootstrap
alpha tuner beside the scheduling loop, into SGLang 0.5.23's `UnifiedRadixCache`;
`marconi.engines.integrations.vllm` does the same for the Mamba states vLLM 0.32's block pool
evicts, and takes the cached KV no hit can reach first. `common` holds what both share.
Each integration imports its engine, so it runs only in that engine's environment.
"""
