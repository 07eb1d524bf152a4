"""Metrics of one replay (DESIGN section 7), computed from its per-request records."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
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


# two-sided 95% quantiles of Student's t, degrees of freedom 1-30
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with `df` degrees of freedom (tabulated to
    30; beyond, the Cornish-Fisher expansion around the normal's 1.96, within 1e-3)."""
    if df < 1:
        raise ValueError(f"t95: degrees of freedom must be >= 1, got {df!r}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True, slots=True)
class PairedMargin:
    """How much `a` beats `b` over paired runs (the same seeds): mean and 95% interval."""

    mean: float
    low: float
    high: float
    runs: int

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def paired_margin(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> PairedMargin:
    """Mean of a - b over paired runs with a Student t 95% confidence interval: whether a
    policy beats another on average, not on one lucky draw. Needs two runs or more."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"paired_margin needs two equal-length series of >= 2 runs, got "
                         f"shapes {x.shape} and {y.shape}")
    diff = x - y
    mean = float(diff.mean())
    half = t95(len(diff) - 1) * float(diff.std(ddof=1)) / math.sqrt(len(diff))
    return PairedMargin(mean, mean - half, mean + half, len(diff))
