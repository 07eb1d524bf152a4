"""Hybrid model families: the one registry the cost model, the engine and the tests read.

A `Family` is one transformers `model_type`. It says how to read that family's Hugging Face
`config.json` into exact `ModelSpec` fields (`spec.from_hf_config`, docs/architecture.md,
"Cost model") and, when the reference engine runs it, the plain facts the engine needs
(`EngineFacts`: a tiny random-weight config, the scan's chunk-size field). `engines/hf/models.py`
builds its `ARCHITECTURES` from the families with engine facts, `spec.HF_FAMILIES` is every
family's reader, and the tests iterate `FAMILIES` / `ENGINE_FAMILIES`: adding a family is
one entry here. Plain data and config arithmetic only: no torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# --- exact specs from Hugging Face configs -------------------------------------------------
#
# Each family reads a raw `config.json` dict (the defaults mirror transformers 5.24) and
# returns the counts and sizes that differ from the paper's defaults. The recurrent state
# is float32 unless the config says otherwise: transformers' scans (and mamba_ssm's) keep
# it in float32 whatever the weights' dtype, while the conv state follows the weights.

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8,
                "float8_e4m3fn": 1}


def _get(cfg: dict, key: str, default: object) -> object:
    value = cfg.get(key)
    return default if value is None else value


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"config field {key!r} must be an integer, got {value!r}")
    return int(value)


def _list(cfg: dict, key: str, default: list) -> list:
    value = _get(cfg, key, default)
    if not isinstance(value, list | tuple):
        raise ValueError(f"config field {key!r} must be a list, got {value!r}")
    return list(value)


def _dtype_bytes(cfg: dict, key: str, default: str) -> int:
    name = str(_get(cfg, key, default)).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"config field {key!r}: unknown dtype {name!r}")
    return _DTYPE_BYTES[name]


def _kv_dim(cfg: dict, head_dim: int | None = None) -> int:
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    return kv_heads * (head_dim or _int(cfg, "head_dim", _int(cfg, "hidden_size") // heads))


def _mamba2(d_inner: int, heads: int, head_dim: int, groups: int, d_state: int,
            kernel: int) -> dict[str, int]:
    """Sizes of a Mamba2 (SSD) layer: state heads x head_dim x N, conv over x, B and C."""
    if heads * head_dim != d_inner:
        raise ValueError(f"mamba heads x head_dim ({heads} x {head_dim}) != d_inner {d_inner}")
    return {"d_state": d_state, "ssm_state_elems": heads * head_dim * d_state,
            "conv_channels": d_inner + 2 * groups * d_state, "conv_kernel": kernel}


def _counts(kinds: list[str], attention: set[str], ssm: set[str], mlp: set[str] | None) -> dict:
    """Layer counts from a per-layer type list; `mlp=None`: every layer has an MLP."""
    return {"attention_layers": sum(k in attention for k in kinds),
            "ssm_layers": sum(k in ssm for k in kinds),
            "mlp_layers": len(kinds) if mlp is None else sum(k in mlp for k in kinds)}


def _auto_head(cfg: dict, key: str, d_inner: int, heads: int) -> int:
    value = _get(cfg, key, "auto")
    return d_inner // heads if value == "auto" else _int(cfg, key)


def _bamba_like(cfg: dict, d_inner: int) -> dict:
    heads = _int(cfg, "mamba_n_heads", 128)
    return _mamba2(d_inner, heads, _auto_head(cfg, "mamba_d_head", d_inner, heads),
                   _int(cfg, "mamba_n_groups", 1), _int(cfg, "mamba_d_state", 256),
                   _int(cfg, "mamba_d_conv", 4))


def _bamba(cfg: dict) -> dict:
    n = _int(cfg, "num_hidden_layers", 32)
    attn = set(_list(cfg, "attn_layer_indices", []))
    kinds = ["attention" if i in attn else "mamba" for i in range(n)]
    d_inner = _int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size")
    return {**_counts(kinds, {"attention"}, {"mamba"}, None), **_bamba_like(cfg, d_inner),
            "kv_dim": _kv_dim(cfg)}


def _granite(cfg: dict) -> dict:
    n = _int(cfg, "num_hidden_layers", 32)
    kinds = _list(cfg, "layer_types", _list(cfg, "layers_block_type", ["mamba"] * n))
    d_inner = _int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size")
    return {**_counts(kinds, {"attention", "full_attention"}, {"mamba", "linear_attention"},
                      None), **_bamba_like(cfg, d_inner), "kv_dim": _kv_dim(cfg)}


def _falcon_h1(cfg: dict) -> dict:
    n = _int(cfg, "num_hidden_layers", 32)
    d_inner = _int(cfg, "mamba_d_ssm", _int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size"))
    return {"attention_layers": n, "ssm_layers": n, "mlp_layers": n,
            **_bamba_like(cfg, d_inner), "kv_dim": _kv_dim(cfg)}


_NEMOTRON_PATTERN = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def _nemotron_h(cfg: dict) -> dict:
    kinds = cfg.get("layers_block_type") or cfg.get("layer_types")
    if kinds is None:
        pattern = str(_get(cfg, "hybrid_override_pattern", "ME*-"))
        kinds = [_NEMOTRON_PATTERN[char] for char in pattern]
    heads, head_dim = _int(cfg, "mamba_num_heads", 128), _int(cfg, "mamba_head_dim", 64)
    return {**_counts(list(kinds), {"attention", "full_attention"},
                      {"mamba", "linear_attention"}, {"mlp", "moe"}),
            **_mamba2(heads * head_dim, heads, head_dim, _int(cfg, "n_groups", 8),
                      _int(cfg, "ssm_state_size", 128), _int(cfg, "conv_kernel", 4)),
            "kv_dim": _kv_dim(cfg, _int(cfg, "head_dim", 128)),
            "state_dtype_bytes": _dtype_bytes(cfg, "mamba_ssm_cache_dtype", "float32")}


def _zamba2(cfg: dict) -> dict:
    hidden, n = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers", 54)
    kinds = _list(cfg, "layers_block_type", ["mamba"] * n)
    heads, d_inner = _int(cfg, "n_mamba_heads", 8), _int(cfg, "mamba_expand", 2) * hidden
    return {**_counts(kinds, {"hybrid"}, {"mamba", "linear_attention", "hybrid"}, {"hybrid"}),
            **_mamba2(d_inner, heads, d_inner // heads, _int(cfg, "mamba_ngroups", 1),
                      _int(cfg, "mamba_d_state", 64), _int(cfg, "mamba_d_conv", 4)),
            "kv_dim": _kv_dim(cfg, 2 * hidden // _int(cfg, "num_attention_heads"))}


def _qwen3_next(cfg: dict) -> dict:
    n = _int(cfg, "num_hidden_layers", 48)
    interval = _int(cfg, "full_attention_interval", 4)
    default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    kinds = _list(cfg, "layer_types", default)
    nk, nv = _int(cfg, "linear_num_key_heads", 16), _int(cfg, "linear_num_value_heads", 32)
    dk, dv = _int(cfg, "linear_key_head_dim", 128), _int(cfg, "linear_value_head_dim", 128)
    return {**_counts(kinds, {"full_attention"}, {"linear_attention"}, None),
            "d_state": dk, "ssm_state_elems": nv * dk * dv, "conv_channels": 2 * nk * dk + nv * dv,
            "conv_kernel": _int(cfg, "linear_conv_kernel_dim", 4),
            "kv_dim": _kv_dim(cfg, _int(cfg, "head_dim", 256))}


def _jamba(cfg: dict) -> dict:
    n, period = _int(cfg, "num_hidden_layers", 32), _int(cfg, "attn_layer_period", 8)
    offset = _int(cfg, "attn_layer_offset", 4)
    kinds = ["attention" if i % period == offset else "mamba" for i in range(n)]
    d_inner, d_state = _int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size"), _int(
        cfg, "mamba_d_state", 16)
    return {**_counts(kinds, {"attention"}, {"mamba"}, None), "d_state": d_state,
            "ssm_state_elems": d_inner * d_state, "conv_channels": d_inner,
            "conv_kernel": _int(cfg, "mamba_d_conv", 4), "kv_dim": _kv_dim(cfg)}


# --- tiny random-weight models (the engine's tests and benchmarks) -------------------------
#
# Config fields of a small model per family; `engine.models.tiny_model` builds it and sets
# its SSM mixers so that their state reaches the logits (`engine.models.make_state_matter`).

_TINY = {"vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 4096}


def _tiny_bamba() -> dict[str, Any]:
    return {**_TINY, "num_hidden_layers": 4, "attn_layer_indices": [1, 3], "mamba_n_heads": 8,
            "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_chunk_size": 16}


def _tiny_nemotron_h() -> dict[str, Any]:
    return {**_TINY, "layers_block_type": ["mamba", "attention", "mamba", "mlp"], "head_dim": 16,
            "ssm_state_size": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2,
            "chunk_size": 16}


def _tiny_granite() -> dict[str, Any]:
    return {**_TINY, "num_hidden_layers": 4, "mamba_n_heads": 8, "mamba_n_groups": 2,
            "layer_types": ["mamba", "attention", "mamba", "attention"], "mamba_d_state": 16,
            "mamba_chunk_size": 16, "num_local_experts": 4, "shared_intermediate_size": 64}


def _tiny_falcon_h1() -> dict[str, Any]:
    # the gated RMSNorm after the scan (off by default) lifts its small output, as it
    # does in the other families, so the state reaches the logits
    return {**_TINY, "num_hidden_layers": 3, "mamba_d_ssm": 128, "mamba_n_heads": 8,
            "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_chunk_size": 16,
            "mamba_rms_norm": True}


def _tiny_zamba2() -> dict[str, Any]:
    return {**_TINY, "num_hidden_layers": 4, "mamba_d_state": 16, "n_mamba_heads": 8,
            "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "mamba_ngroups": 2,
            "chunk_size": 16}


def _tiny_qwen3_next() -> dict[str, Any]:
    return {**_TINY, "num_hidden_layers": 4, "head_dim": 16, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32}


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFacts:
    """What the reference engine (engines/hf/models.py) needs to run a family."""

    tiny: Callable[[], dict[str, Any]]  # config fields of a small random-weight model
    chunk_key: str | None  # config field with the SSD scan's chunk size; None: no chunked scan


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """One hybrid model family."""

    name: str  # the transformers `model_type` (config.json's "model_type"), the registry key
    read: Callable[[dict], dict]  # config.json dict -> ModelSpec fields (`from_hf_config`)
    engine: EngineFacts | None  # None: the cost model sizes it, the engine does not run it


def _registry(families: Iterable[Family]) -> dict[str, Family]:
    out: dict[str, Family] = {}
    for family in families:
        if family.name in out:
            raise ValueError(f"model family {family.name!r} declared twice")
        out[family.name] = family
    return out


FAMILIES: dict[str, Family] = _registry((
    Family(name="bamba", read=_bamba,
           engine=EngineFacts(tiny=_tiny_bamba, chunk_key="mamba_chunk_size")),
    Family(name="nemotron_h", read=_nemotron_h,
           engine=EngineFacts(tiny=_tiny_nemotron_h, chunk_key="chunk_size")),
    Family(name="granitemoehybrid", read=_granite,
           engine=EngineFacts(tiny=_tiny_granite, chunk_key="mamba_chunk_size")),
    Family(name="falcon_h1", read=_falcon_h1,
           engine=EngineFacts(tiny=_tiny_falcon_h1, chunk_key="mamba_chunk_size")),
    Family(name="zamba2", read=_zamba2,
           engine=EngineFacts(tiny=_tiny_zamba2, chunk_key="chunk_size")),
    Family(name="qwen3_next", read=_qwen3_next,
           engine=EngineFacts(tiny=_tiny_qwen3_next, chunk_key=None)),
    # Jamba (Mamba1) is left out of the engine on purpose: its multi-token scan ignores a
    # cached state, so a restored checkpoint would not be exact. The cost model sizes it.
    Family(name="jamba", read=_jamba, engine=None),
))

ENGINE_FAMILIES: tuple[str, ...] = tuple(
    name for name, family in FAMILIES.items() if family.engine is not None)
