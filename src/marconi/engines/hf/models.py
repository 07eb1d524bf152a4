"""Hybrid models the reference engine runs: the families of `core/families.py` that carry
engine facts, over transformers' own classes.

`tiny_model(arch, seed)` builds a small random-weight model in code (tests, benchmarks),
its SSM layers adjusted so that their state matters (`make_state_matter`); `load_model(path)` loads
a local checkpoint folder (config.json + safetensors). Nothing is ever downloaded. Every
model comes with its exact `ModelSpec` (`spec.from_hf_config`) and the layer layout the
state snapshots need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PretrainedConfig
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

from marconi.core.families import FAMILIES
from marconi.core.spec import ModelSpec, from_hf_config


@dataclass(frozen=True, slots=True, kw_only=True)
class Architecture:
    """One family the engine runs: its `core.families` entry, as the engine reads it."""

    name: str  # transformers model_type, the registry key
    tiny: Callable[[], dict[str, Any]]  # config fields of a small random-weight model
    chunk_key: str | None  # config field with the SSD scan's chunk size; None: no chunked scan


# Derived from the one registry (core/families.py): every family with engine facts, none
# other (Jamba is sized by the cost model only, see its entry there).
ARCHITECTURES: dict[str, Architecture] = {
    name: Architecture(name=name, tiny=family.engine.tiny, chunk_key=family.engine.chunk_key)
    for name, family in FAMILIES.items() if family.engine is not None}


def architecture(name: str) -> Architecture:
    """The registry entry for `name` (a transformers model_type); ValueError if unsupported."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {name!r}; supported: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[name]


@dataclass(frozen=True, slots=True)
class HybridModel:
    """A loaded model, its exact spec, and which cache layers hold KV and SSM state."""

    arch: Architecture
    module: torch.nn.Module  # the transformers *ForCausalLM, in eval mode
    config: PretrainedConfig
    spec: ModelSpec  # exact bytes, checked against the tensors by tests
    attention_layers: tuple[int, ...]  # cache layers with per-token K/V
    ssm_layers: tuple[int, ...]  # cache layers with a conv + recurrent state
    max_context: int  # longest sequence (prompt + output) accepted
    chunk_size: int | None  # SSD scan chunk, for chunk-boundary checkpoints
    vocab_size: int

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)


def _layout(config: PretrainedConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    layers = DynamicCache(config=config).layers
    attention = tuple(i for i, layer in enumerate(layers) if isinstance(layer, CacheLayerMixin))
    if any(getattr(layers[i], "is_sliding", False) for i in attention):
        raise ValueError("sliding-window attention layers are not supported by the engine")
    ssm = tuple(i for i, layer in enumerate(layers)
                if isinstance(layer, LinearAttentionCacheLayerMixin))
    return attention, ssm


def _wrap(module: torch.nn.Module, config: PretrainedConfig, arch: Architecture) -> HybridModel:
    dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
    spec = from_hf_config(config, dtype=dtype)
    attention, ssm = _layout(config)
    chunk = getattr(config, arch.chunk_key) if arch.chunk_key else None
    return HybridModel(arch=arch, module=module.eval(), config=config, spec=spec,
                       attention_layers=attention, ssm_layers=ssm,
                       max_context=int(config.max_position_embeddings), chunk_size=chunk,
                       vocab_size=int(config.vocab_size))


# `make_state_matter`: what the SSM layers of a tiny model are set to (docs/architecture.md,
# "Modules", engines/hf/models.py). At transformers' initialization the state barely reaches the
# logits (zeroing a restored recurrent state moves them by ~1e-6): the projections are
# small next to the skip connection, and the state decays within a few tokens. Then a
# cache that restored the wrong state, or none, would look exact.
SLOW_A_LOG = -4.0  # A = -exp(-4): a state decays by ~1% a token
DT_BIAS = 0.0  # dt = softplus(0) ~ 0.69
PROJECTION_GAIN = 5.0  # in and out projections of the SSM mixer, scaled
SSM_PARAMETERS = ("A_log", "dt_bias")


def make_state_matter(model: torch.nn.Module) -> int:
    """Make every SSM mixer of `model` depend on its state: a slowly decaying state
    (`SLOW_A_LOG`, `DT_BIAS`), no skip connection (`D` = 0, so the output is the state's
    read-out alone) and in/out projections scaled by `PROJECTION_GAIN`. Deterministic, in
    place; returns the number of mixers changed. Cached and uncached runs still agree to
    float32 rounding (tests/engine/test_models.py measures both)."""
    changed = 0
    with torch.no_grad():
        for mixer in model.modules():
            a_log, dt_bias = (getattr(mixer, p, None) for p in SSM_PARAMETERS)
            if not (isinstance(a_log, torch.nn.Parameter)
                    and isinstance(dt_bias, torch.nn.Parameter)):
                continue
            a_log.fill_(SLOW_A_LOG)
            dt_bias.fill_(DT_BIAS)
            skip = getattr(mixer, "D", None)
            if isinstance(skip, torch.nn.Parameter):
                skip.zero_()
            for name in ("in_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"):
                layer = getattr(mixer, name, None)
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.mul_(PROJECTION_GAIN)
            changed += 1
    return changed


def tiny_model(arch: str = "bamba", seed: int = 0, dtype: torch.dtype = torch.float32,
               *, stateful: bool = True, **overrides: Any) -> HybridModel:
    """A small random-weight model of family `arch` (default a tiny float32 Bamba).

    `overrides` replace tiny config fields (e.g. `max_position_embeddings=64`).
    `stateful`: adjust its SSM layers with `make_state_matter` so that a wrong restored state shows
    in the logits (False: transformers' initialization, whose state barely does).
    """
    family = architecture(arch)
    config = AutoConfig.for_model(arch, **{**family.tiny(), **overrides})
    torch.manual_seed(seed)
    module = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if stateful and not make_state_matter(module):
        raise ValueError(f"{arch}: no SSM mixer found to adjust")
    return _wrap(module, config, family)


def _check_checkpoint(folder: Path) -> None:
    if not folder.is_dir():
        raise ValueError(f"checkpoint folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ValueError(f"checkpoint {folder} has no config.json")
    if not list(folder.glob("*.safetensors")):
        raise ValueError(f"checkpoint {folder} has no *.safetensors weights")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> HybridModel:
    """Load a local checkpoint folder (config.json + safetensors); never downloads.

    Raises:
        ValueError: missing folder/files, unsupported architecture, or unreadable weights.
    """
    folder = Path(path)
    _check_checkpoint(folder)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"cannot read {folder / 'config.json'}: {err}") from None
    family = architecture(str(config.model_type))
    try:
        module = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"cannot load weights from {folder}: {err}") from None
    return _wrap(module, config, family)
