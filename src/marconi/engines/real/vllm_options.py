"""The vLLM worker's inputs, checked: its options (`OPTION_RULES`: each one's default and
what it accepts, then the rules between them) and its trace; `UsageError` (exit 2) for
anything bad, raised here and wherever else the worker finds a bad option or request.

Which states vLLM 0.32 keeps is `retention_interval` (`--prefix-cache-retention-interval`,
reaching the coordinator through `KVCacheConfig.prefix_cache_retention_interval`): 0, the
default, keeps only the prompt's replay boundary (`num_prompt_tokens - 1` rounded down to
a block) and shared-prefix junctions; a multiple of the block size adds one state per
interval; null keeps every state (each chunk end and each block boundary of decode).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engine_flags import (  # the systems' flags
    VLLM_BLOCK_BASES,
    VLLM_CACHE_MODES,
    VLLM_DEFAULTS,
)

# FlashAttention's kernel block constraint (`get_supported_kernel_block_sizes`:
# MultipleOf(16)) and CacheConfig.DEFAULT_BLOCK_SIZE: both 16 on CUDA.
KERNEL_BLOCK = 16


class UsageError(Exception):
    """Bad options or trace, unsupported vLLM, or a pool too small: exit 2."""


# --- options -----------------------------------------------------------------------------

_REQUIRED = object()


def _int_rule(low: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


@dataclass(frozen=True)
class Rule:
    default: object
    check: Callable[[object], bool]
    allowed: str  # shown in the error message


OPTION_RULES: dict[str, Rule] = {
    "attention_layers": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "kv_layer_bytes_per_token": Rule(
        _REQUIRED, _int_rule(1), "an integer >= 1, a multiple of 2 * dtype_bytes"),
    "ssm_layers": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "conv_state_bytes": Rule(_REQUIRED, _int_rule(0), "an integer >= 0"),
    "ssm_state_bytes": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "dtype_bytes": Rule(2, lambda v: _int_rule(1)(v) and v in (1, 2, 4), "1, 2 or 4"),
    "memory_bytes": Rule(_REQUIRED, _int_rule(1), "an integer >= 1"),
    "block_size": Rule(
        VLLM_DEFAULTS["block_size"], lambda v: v is None or (isinstance(v, int) and _int_rule(16)(v)
                                      and v % KERNEL_BLOCK == 0),
        "null or a positive multiple of 16"),
    # CacheConfig.DEFAULT_BLOCK_SIZE as the parent sized the pool with it (block_size
    # null): the worker refuses one that is not its vLLM's (16 in 0.32-0.33, 64 in 0.34)
    "default_block_size": Rule(VLLM_DEFAULTS["default_block_size"],
                               lambda v: str(v) in VLLM_BLOCK_BASES and isinstance(v, int),
                               " or ".join(VLLM_BLOCK_BASES)),
    # vLLM 0.32 knows "align" and "none"; "none" disables Mamba prefix caching, and with
    # prefix caching on MambaModelConfig turns it into "align". There is no "all" mode.
    "mamba_cache_mode": Rule(VLLM_DEFAULTS["mamba_cache_mode"],
                             lambda v: v in VLLM_CACHE_MODES, '"align" (vLLM 0.32 has no "all")'),
    # --prefix-cache-retention-interval; null is vLLM's None (every state kept).
    "retention_interval": Rule(
        VLLM_DEFAULTS["retention_interval"], lambda v: v is None or _int_rule(0)(v),
        "null or an integer >= 0 (0 or a multiple of the block size)"),
    "max_num_batched_tokens": Rule(VLLM_DEFAULTS["max_num_batched_tokens"], _int_rule(1),
                                   "an integer >= 1"),
    "check": Rule(False, lambda v: isinstance(v, bool), "true or false"),
    # requests overlap as they arrive (arrivals.py): each runs TTFT (from the parent, on
    # stdin) + decode_s_per_token x n_output; false: one at a time, in arrival order
    "concurrent": Rule(False, lambda v: isinstance(v, bool), "true or false"),
    "decode_s_per_token": Rule(
        0.02, lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "a number >= 0"),
    "progress_every": Rule(0, _int_rule(0), "an integer >= 0 (0: only at the end)"),
    # marconi's eviction inside this vLLM (the module `installer` names, imported from
    # `src` only when asked): null, or {alpha, background, installer, orphans_first,
    # policy, spec, src}
    "integration": Rule(None, lambda v: v is None or _integration_rule(v),
                        "null or an object with exactly alpha, background, installer (a "
                        "module name), orphans_first, policy, spec (an object) and src (a "
                        "folder)"),
}

INTEGRATION_KEYS = ("alpha", "background", "installer", "orphans_first", "policy", "spec",
                    "src")


def _integration_rule(value: object) -> bool:
    return (isinstance(value, dict) and sorted(value) == list(INTEGRATION_KEYS)
            and isinstance(value["spec"], dict) and isinstance(value["src"], str)
            and isinstance(value["installer"], str))


def load_options(path: Path) -> dict[str, Any]:
    """Options with defaults filled in; every key and value checked."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"options {path}: cannot read JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"options {path}: expected a JSON object")
    for key in raw:
        if key not in OPTION_RULES:
            raise UsageError(f"option {key!r} is unknown; allowed: {', '.join(OPTION_RULES)}")
    options: dict[str, Any] = {}
    for key, rule in OPTION_RULES.items():
        if key not in raw and rule.default is _REQUIRED:
            raise UsageError(f"option {key!r} is required: {rule.allowed}")
        value = raw.get(key, rule.default)
        if not rule.check(value):
            raise UsageError(f"option {key!r}: expected {rule.allowed}, got {value!r}")
        options[key] = value
    _check_divisible(options)
    return options


def _check_divisible(options: dict[str, Any]) -> None:
    """A token's K and V must be whole elements of `dtype_bytes` (the head size)."""
    d, key = options["dtype_bytes"], "kv_layer_bytes_per_token"
    if options[key] % (2 * d):
        raise UsageError(f"option {key!r}: expected {OPTION_RULES[key].allowed}, "
                         f"got {options[key]!r} with dtype_bytes={d}")


def check_retention(options: dict[str, Any], block_size: int) -> None:
    """The coordinator's rule (`_validate_prefix_cache_retention_interval`), said early."""
    interval = options["retention_interval"]
    if interval and interval % block_size:
        raise UsageError(f"option 'retention_interval': expected null, 0 or a multiple of "
                         f"the block size {block_size}, got {interval}")


# --- trace -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    tokens: np.ndarray
    offsets: np.ndarray
    n_input: np.ndarray
    order: np.ndarray  # request indices in arrival order
    arrival: np.ndarray

    def __len__(self) -> int:
        return len(self.n_input)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def load_trace(path: Path) -> Trace:
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in ("tokens", "offsets", "n_input", "arrival")}
    except (OSError, KeyError, ValueError) as exc:
        raise UsageError(f"trace {path}: cannot read its arrays ({exc})") from None
    offsets, n_input = arrays["offsets"].astype(np.int64), arrays["n_input"].astype(np.int64)
    n = len(n_input)
    lengths = np.diff(offsets)
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(arrays["tokens"]):
        raise UsageError(f"trace {path}: offsets must be n+1 long, from 0 to len(tokens)")
    if len(arrays["arrival"]) != n or np.any(n_input < 1) or np.any(lengths < n_input):
        raise UsageError(f"trace {path}: need 1 <= n_input[i] <= request length, n arrivals")
    order = np.argsort(arrays["arrival"], kind="stable")  # ties keep trace order
    return Trace(arrays["tokens"].astype(np.int64), offsets, n_input, order,
                 arrays["arrival"].astype(np.float64))
