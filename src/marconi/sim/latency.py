"""TTFT models: seconds to prefill `n` tokens when the first `hit` come from the cache."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Protocol

import numpy as np

from marconi.core.spec import ModelSpec

# An A100's fp16 peak is 312 TFLOP/s; prefill typically achieves about half of it.
DEFAULT_FLOPS_RATE = 1.5e14


class LatencyModel(Protocol):
    def ttft(self, n_input: np.ndarray, hit: np.ndarray) -> np.ndarray:
        """Seconds to the first token for each request (vectorized)."""


class FlopsLatency:
    """FLOPs left to compute over an accelerator's achieved rate, plus a fixed overhead."""

    def __init__(self, spec: ModelSpec, rate: float = DEFAULT_FLOPS_RATE,
                 overhead_s: float = 0.0) -> None:
        if not rate > 0:
            raise ValueError(f"FLOP rate must be > 0 FLOP/s, got {rate!r}")
        if overhead_s < 0:
            raise ValueError(f"latency overhead must be >= 0 s, got {overhead_s!r}")
        self.spec, self.rate, self.overhead_s = spec, float(rate), float(overhead_s)

    def ttft(self, n_input: np.ndarray, hit: np.ndarray) -> np.ndarray:
        left = self.spec.flops_array(n_input) - self.spec.flops_array(hit)
        return self.overhead_s + left / self.rate


class ProfileLatency:
    """A measured profile (the reference engine writes one): CSV with columns
    `tokens_to_prefill, cached_tokens, seconds`, fitted by least squares to
    seconds = a + b t + c t^2 + d t c, with t tokens to prefill and c cached tokens."""

    COLUMNS = ("tokens_to_prefill", "cached_tokens", "seconds")

    def __init__(self, path: str | Path) -> None:
        rows = _read_profile(Path(path))
        t, c, s = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
        features = np.stack([np.ones_like(t), t, t * t, t * c], axis=1)
        self.coef, *_ = np.linalg.lstsq(features, s, rcond=None)
        self.path = str(path)

    def ttft(self, n_input: np.ndarray, hit: np.ndarray) -> np.ndarray:
        c = np.asarray(hit, dtype=np.float64)
        t = np.asarray(n_input, dtype=np.float64) - c
        a, b, q, d = self.coef
        return np.maximum(a + b * t + q * t * t + d * t * c, 0.0)


def _read_profile(path: Path) -> list[tuple[float, float, float]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = set(ProfileLatency.COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{path}: latency profile lacks column(s) {sorted(missing)}")
            rows = [_profile_row(path, i, row) for i, row in enumerate(reader, start=2)]
    except OSError as err:
        raise ValueError(f"{path}: cannot read latency profile: {err.strerror}") from None
    if len(rows) < 4:
        raise ValueError(f"{path}: latency profile needs at least 4 rows, has {len(rows)}")
    return rows


def _profile_row(path: Path, line: int, row: dict[str, str]) -> tuple[float, float, float]:
    values = []
    for name in ProfileLatency.COLUMNS:
        try:
            values.append(float(row[name]))
        except (TypeError, ValueError):
            raise ValueError(f"{path}, line {line}: field {name!r} is not a number: "
                             f"{row[name]!r}") from None
    return values[0], values[1], values[2]
