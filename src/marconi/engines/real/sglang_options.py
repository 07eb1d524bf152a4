"""The SGLang worker's inputs, checked: its options (`REQUIRED`, `DEFAULTS`, and what
SGLang's server-argument validation would refuse, refused here first) and its trace;
`UsageError` (exit 2) for anything bad, raised here and wherever else the worker finds a
bad option or a request the pools cannot hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from marconi.engine_flags import SGLANG_CORES as CORES  # the systems' flags
from marconi.engine_flags import SGLANG_DEFAULTS
from marconi.engine_flags import SGLANG_EVICTIONS as EVICTIONS
from marconi.engine_flags import SGLANG_STRATEGIES as STRATEGIES

DEFAULTS: dict[str, Any] = {
    **SGLANG_DEFAULTS,  # strategy, eviction, page_size, chunked_prefill_size (-1: none), core
    "track_interval": 256,  # --mamba-track-interval
    "mamba_chunk_size": None,  # the model's; None: SGLang's fallback, FLA's CHUNK_SIZE (64)
    "check": False, "progress_every": 0,
    # requests overlap as they arrive (arrivals.py): each runs TTFT (from the parent, on
    # stdin) + decode_s_per_token x n_output; false: one at a time, in arrival order
    "concurrent": False, "decode_s_per_token": 0.02,
    # marconi's eviction inside this SGLang (the module `installer` names, imported from
    # `src`, the only marconi this worker ever imports): null, or {"policy": "marconi",
    # "spec": a ModelSpec's fields, "alpha": null (tuned) or a number, "background":
    # whether the tuner runs in its thread, "src": the folder holding marconi,
    # "installer": the module whose `install_from` installs it}
    "integration": None,
    "model": None,  # marconi's layer byte sizes: recorded, not used (only indices matter)
}
REQUIRED = ("kv_tokens", "mamba_slots")
FLA_CHUNK_SIZE = 64  # sglang.kernels.ops.attention.fla.chunk_delta_h.CHUNK_SIZE


class UsageError(Exception):
    """Bad options, a wrong engine version, or a request the pools cannot hold: exit 2."""


# --- options ----------------------------------------------------------------------------


def _int_option(key: str, value: Any, low: int, also: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"option {key!r}: {value!r} is not an integer >= {low}{also}")
    return value


def _choice_option(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"option {key!r}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _check_model(value: Any) -> Any:
    if value is not None and not (isinstance(value, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values())):
        raise UsageError(f"option 'model': {value!r} is not null or an object of integers")
    return value


def resolve_options(raw: Any) -> dict[str, Any]:
    """Every key checked, defaults filled in; UsageError naming the first bad key."""
    _check_keys(raw)
    opts = {**DEFAULTS, **raw}
    for key in ("kv_tokens", "mamba_slots", "page_size", "track_interval"):
        _int_option(key, opts[key], 1)
    if opts["chunked_prefill_size"] != -1:
        _int_option("chunked_prefill_size", opts["chunked_prefill_size"], 1,
                    " or -1 (no chunking)")
    _int_option("progress_every", opts["progress_every"], 0)
    if opts["mamba_chunk_size"] is not None:
        _int_option("mamba_chunk_size", opts["mamba_chunk_size"], 1, " or null")
    integration = opts["integration"]
    # an installed declared priority is SGLang's strategy of its name (`install_priority`)
    evictions = (*EVICTIONS, integration["policy"]) if isinstance(integration, dict) \
        and isinstance(integration.get("policy"), str) else EVICTIONS
    for key, allowed in (("strategy", STRATEGIES), ("eviction", evictions), ("core", CORES)):
        _choice_option(key, opts[key], allowed)
    for key in ("check", "concurrent"):
        if not isinstance(opts[key], bool):
            raise UsageError(f"option {key!r}: {opts[key]!r} is not true or false")
    decode = opts["decode_s_per_token"]
    if isinstance(decode, bool) or not isinstance(decode, int | float) or not decode >= 0:
        raise UsageError(f"option 'decode_s_per_token': {decode!r} is not a number >= 0")
    _check_model(opts["model"])
    _check_integration(opts["integration"])
    _check_combination(opts)
    # SGLang's pool is whole pages (`calculate_pool_sizes`: tokens // page * page)
    opts["kv_tokens"] -= opts["kv_tokens"] % opts["page_size"]
    if not opts["kv_tokens"]:
        raise UsageError(f"option 'kv_tokens': less than one page of {opts['page_size']}")
    return opts


INTEGRATION_KEYS = ("policy", "spec", "alpha", "background", "src", "installer")


def _check_integration(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or sorted(value) != sorted(INTEGRATION_KEYS):
        raise UsageError(f"option 'integration': {value!r} is not null or an object with "
                         f"exactly {', '.join(INTEGRATION_KEYS)}")
    if (not isinstance(value["spec"], dict) or not isinstance(value["src"], str)
            or not isinstance(value["installer"], str)):
        raise UsageError("option 'integration': 'spec' must be an object, 'src' a folder, "
                         "'installer' a module name")


def _check_keys(raw: Any) -> None:
    if not isinstance(raw, dict):
        raise UsageError("options: not a JSON object")
    known = (*REQUIRED, *DEFAULTS)
    for key in raw:
        if key not in known:
            raise UsageError(f"option {key!r}: unknown (allowed: {', '.join(known)})")
    for key in REQUIRED:
        if key not in raw:
            raise UsageError(f"option {key!r}: missing (an integer >= 1)")


def _check_combination(opts: dict[str, Any]) -> None:
    """What SGLang's server-argument validation refuses, refused here first."""
    page, chunk = opts["page_size"], opts["mamba_chunk_size"] or FLA_CHUNK_SIZE
    if opts["strategy"] == "no_buffer" and page != 1:
        raise UsageError("option 'page_size': no_buffer only supports 1 (allowed: 1)")
    if max(page, chunk) % min(page, chunk):
        raise UsageError(f"option 'page_size': {page} and mamba_chunk_size {chunk} must "
                         "divide one another")
    if opts["chunked_prefill_size"] != -1 and opts["chunked_prefill_size"] % page:
        raise UsageError(f"option 'chunked_prefill_size': {opts['chunked_prefill_size']} "
                         f"is not a multiple of page_size {page}")
    need = slots_per_running_request(opts["strategy"])
    if opts["mamba_slots"] < need:
        raise UsageError(f"option 'mamba_slots': {opts['mamba_slots']} is too few for "
                         f"{opts['strategy']}, which budgets {need} per running request "
                         f"(SGLang refuses to start below {need})")
    if opts["strategy"] != "no_buffer" and opts["track_interval"] % page:
        raise UsageError(f"option 'track_interval': {opts['track_interval']} is not a "
                         f"multiple of page_size {page}")


def slots_per_running_request(strategy: str) -> int:
    """SGLang's `_calculate_mamba_ratio`: the Mamba slots it budgets per running request,
    `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` (3; no_buffer's binding limit is its
    prefill-to-decode peak) plus the extra buffer's ping-pong tracking slots
    (`get_mamba_tracking_slots`: 2 with overlap, 1 lazy). It caps `max_running_requests`
    at `max_mamba_cache_size` // this and refuses to start below one request."""
    return {"no_buffer": 3, "extra_buffer": 5, "extra_buffer_lazy": 4}[strategy]


def read_options(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"options {path}: {err}") from None
    return resolve_options(raw)


# --- trace ------------------------------------------------------------------------------


class Trace:
    """The worker's trace file: every full sequence in one array, cut by `offsets`."""

    def __init__(self, path: Path):
        try:
            with np.load(path) as data:
                self.tokens = data["tokens"]
                self.offsets = data["offsets"].astype(np.int64)
                self.n_input = data["n_input"].astype(np.int64)
                self.arrival = data["arrival"].astype(np.float64)
        except (OSError, KeyError, ValueError) as err:
            raise UsageError(f"trace {path}: {err}") from None
        n = len(self.n_input)
        if len(self.offsets) != n + 1 or (np.diff(self.offsets) < 0).any() \
                or self.offsets[-1] != len(self.tokens):
            raise UsageError(f"trace {path}: offsets do not cut tokens into {n} requests")
        if len(self.arrival) != n or (np.diff(self.arrival) < 0).any():
            raise UsageError(f"trace {path}: arrivals are not {n} times in order")
        lengths = np.diff(self.offsets)
        self.n_output = lengths - self.n_input
        bad = np.flatnonzero((self.n_input < 1) | (self.n_input > lengths))
        if len(bad):
            raise UsageError(f"request {bad[0]}: {self.n_input[bad[0]]} input tokens of a "
                             f"{lengths[bad[0]]}-token sequence (needs 1 to all of it)")

    def __len__(self) -> int:
        return len(self.n_input)

    def request(self, i: int) -> tuple[np.ndarray, int]:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]], int(self.n_input[i])

    def max_len(self) -> int:
        return int(np.diff(self.offsets).max(initial=1))
