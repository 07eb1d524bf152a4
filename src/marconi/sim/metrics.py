"""Statistics over replays: hit rate by input length, the share of a gap closed, and the
paired margin of one policy over another across arrival seeds (with a 95% CI)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

LENGTH_BINS = (0, 1024, 2048, 4096, 8192, 16384, 32768)  # input lengths, the paper's Fig 10a


def rate(part: float, whole: float) -> float:
    """part / whole as a float; 0 when there is no whole."""
    return float(part) / float(whole) if whole else 0.0


def hit_rate_by_length(n_input: np.ndarray, hit: np.ndarray,
                       bins: tuple[int, ...] = LENGTH_BINS) -> list[dict[str, Any]]:
    """Token hit rate per input-length bin (the paper's Figure 10a)."""
    edges = [*bins[:-1], max(bins[-1], int(n_input.max(initial=0)) + 1)]
    out = []
    for lo, hi in itertools.pairwise(edges):
        mask = (n_input >= lo) & (n_input < hi)
        out.append({"min_tokens": lo, "max_tokens": hi, "requests": int(mask.sum()),
                    "token_hit_rate": rate(hit[mask].sum(), n_input[mask].sum())})
    return out


def gap_closed(saved: float, baseline: float, reference: float) -> float | None:
    """Share of the gap from `baseline` (e.g. SGLang+) to `reference` (the offline policy)
    that a policy saving `saved` FLOPs closes: 0 = baseline, 1 = reference, < 0 = worse
    than the baseline. None when the reference is no better than the baseline."""
    if reference <= baseline:
        return None
    return (saved - baseline) / (reference - baseline)


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with `df` degrees of freedom (scipy's)."""
    if df < 1:
        raise ValueError(f"t95: degrees of freedom must be >= 1, got {df!r}")
    from scipy.stats import t

    return float(t.ppf(0.975, df))


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
