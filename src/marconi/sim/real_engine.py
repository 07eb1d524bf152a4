"""`replay`: a trace through an engine's real cache code, as a `SimResult` like any other
(what `sim.run` runs for a system with an `engine`; the environments and workers it drives
are `marconi.engines.real`).

The engine's pools are sized from marconi's capacity the way the engine sizes them
(docs/peers.md): SGLang gets the KV tokens and state slots of its layout (the same numbers
its emulation `sglang-2026` runs), vLLM the memory, from which it derives its block size
and block count itself. What the result holds comes from the engine's own counters; the
infinite-cache bounds are not computed (they would be a second full replay). With
`config.concurrent` requests overlap as in marconi's concurrent replay (arrivals.py), the
worker asking this process for each request's TTFT.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marconi.core.spec import ModelSpec
from marconi.core.stats import CacheStats
from marconi.core.units import parse_size
from marconi.engine_flags import ENGINES
from marconi.engines.integrations.common import IntegrationError, check_policy, declared_priority
from marconi.engines.real.envs import PeerError
from marconi.engines.real.worker import run_worker
from marconi.sim.result import Records, SimConfig, SimResult
from marconi.systems import System
from marconi.workload.types import Request, Trace

PROGRESS_EVERY = 100  # requests between a worker's progress lines


def model_options(spec: ModelSpec) -> dict[str, int]:
    """The byte sizes a worker builds its engine's layer specs from."""
    recurrent = (spec.ssm_state_elems or spec.d_model * spec.d_state) * (
        spec.state_dtype_bytes or spec.dtype_bytes)
    return {"attention_layers": spec.attention_layers,
            "kv_layer_bytes_per_token": spec.kv_layer_bytes_per_token,
            "ssm_layers": spec.ssm_layers, "ssm_state_bytes": recurrent,
            "conv_state_bytes": spec.ssm_layer_bytes - recurrent,
            "dtype_bytes": spec.dtype_bytes}


def sglang_options(config: SimConfig, system: System) -> dict[str, Any]:
    """SGLang's pools: the KV tokens and state slots of its layout at this capacity."""
    layout = config.layout
    if not layout.pooled:
        raise PeerError(f"{system.name}: SGLang always keeps states in a pool of their own "
                        "(--state-slots 0 has no meaning for it)")
    capacity = parse_size(config.capacity)
    if system.engine_memory is not None:  # less the pool's padding slot
        capacity = system.engine_memory(config.spec, capacity)[1]
    kv = layout.kv_capacity(config.spec, capacity)
    s = system.settings
    out = {"kv_tokens": kv // config.spec.kv_bytes_per_token,
           "mamba_slots": layout.state_slots, "strategy": s["strategy"],
           "eviction": s["eviction"], "page_size": int(str(s["page_size"])),
           "chunked_prefill_size": s["chunked_prefill_size"],
           "core": s["core"], "check": False, "progress_every": PROGRESS_EVERY}
    if s["integration"] != "none":
        if s["core"] != "python":
            raise PeerError(f"{system.name}: marconi's integration needs SGLang's Python tree "
                            "core (core=python)")
        out["integration"] = integration_options(config, system)
        if declared_priority(str(s["integration"])) is not None:
            # the declaration becomes SGLang's eviction strategy of its name
            if s["eviction"] not in ("lru", s["integration"]):
                raise PeerError(f"{system.name}: integration={s['integration']} is the "
                                f"eviction order; eviction={s['eviction']} would be "
                                "replaced by it (leave eviction out)")
            out["eviction"] = s["integration"]
    return out


# The module a worker installs marconi's integration with (`install_from(engine, options)`,
# `IntegrationError`), imported from `src` in the engine's environment.
INSTALLER = "marconi.engines.integrations.common"


def integration_options(config: SimConfig, system: System) -> dict[str, Any] | None:
    """What a worker needs to install marconi's integration in its engine; None: none."""
    s = system.settings
    if s.get("integration", "none") == "none":
        return None
    try:
        check_policy(system.name, str(s["integration"]), " (option integration)")
    except IntegrationError as err:
        raise PeerError(str(err)) from None
    out = {"policy": s["integration"], "spec": dataclasses.asdict(config.spec),
           "alpha": config.alpha, "background": s["tuner"] == "thread",
           "src": str(Path(__file__).resolve().parents[2]),  # src/
           "installer": INSTALLER}
    if "orphans" in s:  # vLLM's
        out["orphans_first"] = s["orphans"] == "first"
    return out


def vllm_options(config: SimConfig, system: System) -> dict[str, Any]:
    """vLLM's memory: the capacity, from which it derives blocks as it does on a GPU."""
    s = system.settings
    return {**model_options(config.spec), "memory_bytes": parse_size(config.capacity),
            "block_size": s["block_size"], "mamba_cache_mode": s["mamba_cache_mode"],
            "default_block_size": int(s["default_block_size"]),  # type: ignore[call-overload]
            "retention_interval": s["retention_interval"],
            "max_num_batched_tokens": s["max_num_batched_tokens"], "check": False,
            "progress_every": PROGRESS_EVERY,
            "integration": integration_options(config, system)}


def replay(trace: Trace | Sequence[Request], config: SimConfig, system: System, *,
           progress: bool = False, check: bool = False,
           ttft: Callable[[int, int], float] | None = None) -> SimResult:
    """Replay `trace` through `system`'s engine (one request running at a time, or
    overlapping as they arrive with `config.concurrent`). `check`: the engine's own
    integrity checks after every request (concurrent: whenever none runs). `ttft(i, hit)`:
    the seconds from request i's start to its finish, instead of the latency model's TTFT
    plus its decode (a served run's own timeline, `sim.served`; concurrent only, with no
    decode time). PeerError when the environment is missing or the replay fails; never a
    partial result."""
    if not isinstance(trace, Sequence):
        raise PeerError(f"{system.name}: a real-engine replay needs the whole trace, not a "
                        "stream")
    assert system.engine is not None
    if config.replay == "serving":
        raise PeerError(f"{system.name}: the serving replay does not drive the engine's own "
                        "code; replay it with --replay sequential (--concurrent: the engine's "
                        "own overlap schedule), or compare its in-process emulation under "
                        "the serving replay")
    engine = ENGINES[system.engine]
    make = sglang_options if engine.name == "sglang" else vllm_options
    options = make(config, system)
    if engine.name == "sglang":
        options["model"] = model_options(config.spec)
    options["check"] = check
    if ttft is not None and not config.concurrent:
        raise PeerError(f"{system.name}: a given TTFT times an overlapping replay "
                        "(config.concurrent), not one request at a time")
    if config.concurrent:
        options["concurrent"] = True
        options["decode_s_per_token"] = config.decode_s_per_token
        ttft = ttft or _ttft(trace, config)
    start = time.perf_counter()
    columns, meta = run_worker(engine, trace, options, progress=progress, label=system.name,
                               ttft=ttft)
    if meta.get("waited"):
        print(f"warning: {system.name}: {meta['waited']} of {len(trace)} requests waited "
              f"{meta['wait_seconds']:.1f} s in all for a running request to finish (the "
              "engine's pools or running cap were full); marconi's own concurrent replay "
              "never makes a request wait, so its figures are not comparable",
              file=sys.stderr)
    records, stats = _records(trace, columns, meta, config.spec, engine.name)
    meta["micros_total"] = float(columns["micros"].sum())  # the engine's cache calls alone
    hook = meta.get("integration")  # marconi's eviction inside the engine: its alpha
    alpha = None if hook is None or hook["alpha_status"] == "untuned" else hook["alpha"]
    return SimResult(config=dataclasses.replace(config, system=system.name, bounds=False),
                     trace=trace.name if isinstance(trace, Trace) else "requests",
                     records=records, sessions=[r.session_id for r in trace],
                     arrivals=np.array([r.arrival for r in trace], dtype=np.float64),
                     stats=stats, alpha=0.0 if hook is None else alpha,
                     seconds=time.perf_counter() - start, engine=meta,
                     alpha_status=None if hook is None else hook["alpha_status"])


def _ttft(trace: Sequence[Request], config: SimConfig) -> Callable[[int, int], float]:
    """The seconds to request i's first token with `hit` tokens cached: the run's latency
    model, as marconi's concurrent replay uses it (sim.concurrent)."""
    model = config.latency_model()

    def ttft(i: int, hit: int) -> float:
        if not 0 <= i < len(trace) or not 0 <= hit <= trace[i].n_input:
            raise PeerError(f"the engine's worker asked the TTFT of request {i} with {hit} "
                            "tokens cached, which the trace does not have (a worker bug)")
        return float(model.ttft(np.array([trace[i].n_input]), np.array([hit]))[0])

    return ttft


def _records(trace: Sequence[Request], columns: dict[str, np.ndarray], meta: dict[str, Any],
             spec: ModelSpec, engine: str) -> tuple[Records, CacheStats]:
    records = Records.zeros(len(trace))
    records.n_input[:] = [r.n_input for r in trace]
    records.n_output[:] = [r.n_output for r in trace]
    records.hit[:] = columns["hit"]
    if (records.hit > records.n_input).any():
        i = int(np.argmax(records.hit > records.n_input))
        raise PeerError(f"{engine}: request {i} hit {records.hit[i]} tokens of "
                        f"{records.n_input[i]} input tokens (a worker bug)")
    end = meta["totals"]  # after the last request finished (rows are taken at starts)
    if engine == "sglang":
        records.kv_bytes[:] = columns["kv_tokens"] * spec.kv_bytes_per_token
        records.ssm_bytes[:] = columns["states"] * spec.ssm_bytes
        states = int(end["states"])
        kv_bytes, ssm_bytes = (int(end["kv_tokens"]) * spec.kv_bytes_per_token,
                               states * spec.ssm_bytes)
        evictions = int(end["evicted_states"]) + int(end["evicted_kv"])
    else:
        block = int(meta["block_size"]) * spec.kv_bytes_per_token  # one block id, all layers
        records.kv_bytes[:] = columns["kv_blocks"] * block
        records.ssm_bytes[:] = columns["state_blocks"] * block
        states = int(end["state_blocks"]) // int(meta["blocks_per_state"])
        kv_bytes, ssm_bytes = int(end["kv_blocks"]) * block, int(end["state_blocks"]) * block
        evictions = int(end["evictions"])
    stats = CacheStats(lookups=len(trace), commits=len(trace),
                       input_tokens=int(records.n_input.sum()),
                       hit_tokens=int(records.hit.sum()),
                       hit_requests=int((records.hit > 0).sum()), evictions=evictions)
    stats.states_evicted, stats.states = int(end["evicted_states"]), states
    stats.states_admitted = stats.states + stats.states_evicted
    stats.kv_bytes, stats.ssm_bytes = kv_bytes, ssm_bytes
    stats.peak_bytes = max(int((records.kv_bytes + records.ssm_bytes).max(initial=0)),
                           kv_bytes + ssm_bytes)
    return records, stats
