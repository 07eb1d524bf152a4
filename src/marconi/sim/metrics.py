"""Metrics of one replay (DESIGN section 7), computed from its per-request records."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from marconi.sim.analyze import taxonomy
from marconi.sim.latency import FlopsLatency

if TYPE_CHECKING:
    from marconi.sim.replay import SimResult

LENGTH_BINS = (0, 1024, 2048, 4096, 8192, 16384, 32768)  # input lengths, the paper's Fig 10a


def _rate(part: float, whole: float) -> float:
    return float(part) / float(whole) if whole else 0.0


def summarize(result: SimResult) -> dict[str, Any]:
    """The JSON of `marconi simulate` (keys of DESIGN section 8 first, then extras)."""
    r, spec = result.records, result.config.spec
    n_input, hit = r["n_input"], r["hit"]
    flops_saved = float(spec.flops_array(hit).sum())
    flops_total = float(spec.flops_array(n_input).sum())
    out: dict[str, Any] = {
        "system": result.config.system,
        "trace": result.trace,
        "requests": len(n_input),
        "input_tokens": int(n_input.sum()),
        "hit_tokens": int(hit.sum()),
        "token_hit_rate": _rate(hit.sum(), n_input.sum()),
        "request_hit_rate": _rate((hit > 0).sum(), len(hit)),
        "flops_saved": flops_saved,
        "flops_total": flops_total,
        "flops_saved_rate": _rate(flops_saved, flops_total),
        "alpha": result.alpha,
        "states_admitted": result.stats["states_admitted"],
        "states_evicted": result.stats["states_evicted"],
        "evictions": result.stats["evictions"],
        "refused_commits": result.stats["refused_commits"],
        "peak_bytes": result.stats["peak_bytes"],
        "capacity": int(result.config.capacity) if isinstance(result.config.capacity, int)
        else result.config.capacity,
        "model": spec.name,
        "seconds": result.seconds,
    }
    out |= _ttft(result)
    out |= _memory(result)
    if result.config.bounds:
        out |= _bounds(result)
    out["hit_rate_by_input_length"] = hit_rate_by_length(n_input, hit)
    if result.tuning:
        out["tuning"] = result.tuning
    return out


def ttft_seconds(result: SimResult) -> np.ndarray:
    model = result.config.latency or FlopsLatency(result.config.spec)
    return model.ttft(result.records["n_input"], result.records["hit"])


def _ttft(result: SimResult) -> dict[str, float]:
    t = ttft_seconds(result)
    if not t.size:
        return {"ttft_p5": 0.0, "ttft_p50": 0.0, "ttft_p95": 0.0, "ttft_mean": 0.0}
    p5, p50, p95 = np.percentile(t, [5, 50, 95])
    return {"ttft_p5": float(p5), "ttft_p50": float(p50), "ttft_p95": float(p95),
            "ttft_mean": float(t.mean())}


def _memory(result: SimResult) -> dict[str, float]:
    kv, ssm = result.records["kv_bytes"], result.records["ssm_bytes"]
    if not kv.size:
        return {"kv_bytes_mean": 0.0, "ssm_bytes_mean": 0.0}
    return {"kv_bytes_mean": float(kv.mean()), "ssm_bytes_mean": float(ssm.mean()),
            "kv_bytes_final": int(kv[-1]), "ssm_bytes_final": int(ssm[-1])}


def _bounds(result: SimResult) -> dict[str, Any]:
    """Infinite-cache bounds and where every missed token went.

    ```
    | hit | evicted (bound - hit) | not admitted (seen - bound) | cold (n - seen) |
    0    hit                    bound                          seen              n
    ```
    """
    r = result.records
    n, hit, seen, bound = r["n_input"], r["hit"], r["seen"], np.maximum(r["bound"], r["hit"])
    total = n.sum()
    return {
        "bound_token_hit_rate": _rate(seen.sum(), total),  # every prefix ever seen
        "system_bound_token_hit_rate": _rate(bound.sum(), total),  # same system, no limit
        "miss_tokens": {"cold": int((n - seen).sum()),
                        "not_admitted": int((seen - np.maximum(bound, hit)).clip(0).sum()),
                        "evicted": int((bound - hit).clip(0).sum())},
        "reuse_taxonomy": taxonomy(n, seen, r["from_inputs"]),
    }


def hit_rate_by_length(n_input: np.ndarray, hit: np.ndarray,
                       bins: tuple[int, ...] = LENGTH_BINS) -> list[dict[str, Any]]:
    """Token hit rate per input-length bin (the paper's Figure 10a)."""
    edges = [*bins[:-1], max(bins[-1], int(n_input.max(initial=0)) + 1)]
    out = []
    for lo, hi in itertools.pairwise(edges):
        mask = (n_input >= lo) & (n_input < hi)
        out.append({"min_tokens": lo, "max_tokens": hi, "requests": int(mask.sum()),
                    "token_hit_rate": _rate(hit[mask].sum(), n_input[mask].sum())})
    return out


def gap_closed(saved: float, baseline: float, reference: float) -> float | None:
    """Share of the gap from `baseline` (e.g. SGLang+) to `reference` (the offline policy)
    that a policy saving `saved` FLOPs closes: 0 = baseline, 1 = reference, < 0 = worse
    than the baseline. None when the reference is no better than the baseline."""
    if reference <= baseline:
        return None
    return (saved - baseline) / (reference - baseline)
