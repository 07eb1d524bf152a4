"""Model specs and the paper's cost model (docs/architecture.md, "Cost model").

A `ModelSpec` answers three questions about a hybrid model, and nothing else:

- `flops(L)`: prefill FLOPs for `L` tokens, summed over every layer (the compute a
  cache hit of length `L` saves);
- `kv_bytes_per_token`: attention KV bytes one token holds, over all attention layers;
- `ssm_bytes`: bytes of one SSM checkpoint, recurrent state plus conv state of every
  SSM layer.

The FLOP formulas are the paper's (Table 1); the byte sizes default to the paper's and
can be made exact for a real model (GQA, d_inner, groups, state dtype, conv kernel).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from marconi.core.families import FAMILIES, _dtype_bytes, _get, _int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Dimensions of a hybrid model; derived costs are properties computed here only."""

    name: str = "custom"  # shown in reports
    d_model: int  # D: hidden size, drives every FLOP term
    attention_layers: int  # layers holding a KV cache
    ssm_layers: int  # Mamba-style layers holding one fixed-size state
    mlp_layers: int  # dense MLP blocks (FLOPs only, no state)
    d_state: int  # N: SSM state dimension
    dtype_bytes: int = 2  # KV and conv state element size (fp16 in the paper)
    state_dtype_bytes: int | None = None  # recurrent state element size; None: dtype_bytes
    kv_dim: int | None = None  # K (and V) width per token per layer; None: d_model (no GQA)
    ssm_state_elems: int | None = None  # one layer's recurrent state; None: D * N (paper)
    conv_kernel: int = 4  # conv1d kernel width kept in the conv state
    expand: int = 2  # d_inner = expand * D in the paper's Mamba layers
    conv_channels: int | None = None  # conv state channels; None: expand * D + 2 * N
    max_context: int | None = None  # longest input the model accepts, if known
    checkpoint_extra_bytes: int = 0  # kept with every checkpoint besides SSM layers (logits)

    def __post_init__(self) -> None:
        for name in ("d_model", "d_state", "dtype_bytes", "conv_kernel", "expand"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        for name in ("attention_layers", "ssm_layers", "mlp_layers", "checkpoint_extra_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"ModelSpec.{name} must be a non-negative integer, got {value!r}")
        for name in ("state_dtype_bytes", "kv_dim", "ssm_state_elems", "conv_channels",
                     "max_context"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"ModelSpec.{name} must be a positive integer or None, "
                                 f"got {value!r}")
        if self.attention_layers + self.ssm_layers == 0:
            raise ValueError("ModelSpec needs at least one attention or SSM layer")

    # --- bytes -----------------------------------------------------------------------

    @property
    def kv_layer_bytes_per_token(self) -> int:
        """K and V of one token in one attention layer (paper: 4 D bytes in fp16)."""
        return 2 * (self.kv_dim or self.d_model) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.attention_layers * self.kv_layer_bytes_per_token

    @property
    def ssm_layer_bytes(self) -> int:
        """One SSM layer's checkpoint: recurrent state + conv state."""
        state = (self.ssm_state_elems or self.d_model * self.d_state) * (
            self.state_dtype_bytes or self.dtype_bytes)
        channels = self.conv_channels or self.expand * self.d_model + 2 * self.d_state
        return state + channels * self.conv_kernel * self.dtype_bytes

    @property
    def ssm_bytes(self) -> int:
        """One checkpoint of the whole model: every SSM layer's state, plus what an engine
        keeps beside it (`checkpoint_extra_bytes`, e.g. next-token logits)."""
        return self.ssm_layers * self.ssm_layer_bytes + self.checkpoint_extra_bytes

    # --- FLOPs (paper, Table 1) --------------------------------------------------------

    def flops(self, n_tokens: int) -> int:
        """Prefill FLOPs of `n_tokens` tokens from an empty context, all layers."""
        L, D, N = int(n_tokens), self.d_model, self.d_state
        attention = 8 * L * D * D + 4 * L * L * D
        mlp = 16 * L * D * D
        ssm = 12 * L * D * D + 16 * L * D * N + 10 * L * D
        return self.attention_layers * attention + self.mlp_layers * mlp + self.ssm_layers * ssm

    def flops_array(self, n_tokens: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """`flops` over an array of lengths, as float64 (exact below 2**53)."""
        L = np.asarray(n_tokens, dtype=np.float64)
        D, N = float(self.d_model), float(self.d_state)
        linear = (self.attention_layers * 8 * D * D + self.mlp_layers * 16 * D * D
                  + self.ssm_layers * (12 * D * D + 16 * D * N + 10 * D))
        return L * linear + self.attention_layers * 4 * D * L * L

    def replace(self, **changes: object) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


PAPER_7B = ModelSpec(
    name="paper-7b", d_model=4096, attention_layers=4, ssm_layers=24, mlp_layers=28, d_state=128)

PRESETS: dict[str, ModelSpec] = {PAPER_7B.name: PAPER_7B}

_ALIASES = {"ssm": "ssm_layers", "attn": "attention_layers", "attention": "attention_layers",
            "mlp": "mlp_layers", "N": "d_state", "n": "d_state", "D": "d_model"}


def model_from(text: str) -> ModelSpec:
    """A `--model` value: a Hugging Face `config.json` (or its folder), else a preset
    with optional overrides (`resolve_model`)."""
    if text.endswith(".json") or Path(text).is_dir():
        return from_hf_config(text)
    return resolve_model(text)


def resolve_model(text: str) -> ModelSpec:
    """Parse a `--model` value: a preset name with optional `,key=value` overrides.

    Examples: `paper-7b`, `paper-7b,ssm=28,attn=7`, `paper-7b,d_state=16`. Keys are
    `ModelSpec` fields or the short aliases ssm, attn, mlp, N, D.
    """
    name, *pairs = [part.strip() for part in text.split(",")]
    if name not in PRESETS:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown model {name!r}; known presets: {known}")
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = _ALIASES.get(key.strip(), key.strip())
        if not sep or key not in fields or key == "name":
            raise ValueError(f"bad model override {pair!r} in {text!r}: expected field=integer "
                             f"with field one of {sorted(fields - {'name'})}")
        try:
            changes[key] = int(raw)
        except ValueError:
            raise ValueError(f"bad model override {pair!r} in {text!r}: {raw!r} is not an "
                             "integer") from None
    if changes:
        changes["name"] = text
    return PRESETS[name].replace(**changes)


# --- exact specs from Hugging Face configs -------------------------------------------------
#
# Each family's reader of a raw `config.json` dict is declared once, in its entry of
# `core/families.py` (the registry the engine and the tests read too); `HF_FAMILIES` is
# that registry's model_type -> reader map. The recurrent state is float32 unless the
# reader says otherwise: transformers' scans (and mamba_ssm's) keep it in float32 whatever
# the weights' dtype, while the conv state follows the weights.

HF_FAMILIES: dict[str, Callable[[dict], dict]] = {
    name: family.read for name, family in FAMILIES.items()}


def _config_dict(config: object) -> dict:
    """A raw config dict from a path (file or checkpoint folder), a dict or a PretrainedConfig."""
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, str | Path):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        try:
            loaded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read a model config from {path}: {err}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return loaded
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        raise ValueError(f"expected a path, dict or PretrainedConfig, got {type(config).__name__}")
    return dict(to_dict())


def from_hf_config(config: str | Path | dict | object, *, dtype: str | None = None) -> ModelSpec:
    """An exact `ModelSpec` for a Hugging Face hybrid model config.

    Args:
        config: a `config.json` path, a checkpoint folder, a config dict or a PretrainedConfig.
        dtype: the dtype the weights (and so KV and conv states) are held in; default the
            config's `dtype`/`torch_dtype`, float32 when it names none (transformers' default).

    Raises:
        ValueError: unknown `model_type`, or a field missing or malformed.
    """
    cfg = _config_dict(config)
    model_type = str(cfg.get("model_type"))
    if model_type not in HF_FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                         f"{', '.join(sorted(HF_FAMILIES))}")
    fields = HF_FAMILIES[model_type](cfg)
    fields.setdefault("state_dtype_bytes", 4)
    weights = dtype or _get(cfg, "dtype", _get(cfg, "torch_dtype", "float32"))
    return ModelSpec(name=model_type, d_model=_int(cfg, "hidden_size"),
                     dtype_bytes=_dtype_bytes({"dtype": weights}, "dtype", "float32"),
                     max_context=_int(cfg, "max_position_embeddings", 0) or None, **fields)
