"""TTFT models: seconds to prefill `n` tokens when the first `hit` come from the cache."""

from __future__ import annotations

import csv
import sys
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

    def chunk_seconds(self, done: int, size: int) -> float:
        """`ttft` of one chunk of `size` tokens after `done` computed ones, in plain
        floats (the serving replay asks it per step)."""
        flops = self.spec.flops
        return self.overhead_s + (flops(done + size) - flops(done)) / self.rate

    def native(self) -> tuple[ModelSpec, float, float]:
        """What the compiled serving loop evaluates `chunk_seconds` from, in the same
        operations: (model, rate, overhead)."""
        return self.spec, self.rate, self.overhead_s


class ProfileLatency:
    """A measured profile (the reference engine writes one): CSV with columns
    `tokens_to_prefill, cached_tokens, seconds`.

    Fitted to seconds = a + b t + q t^2 + d t c (t tokens to prefill, c cached) with every
    coefficient >= 0, so predicted TTFT never falls as t grows; it is never below the
    slowest measured seconds per prefilled token either, so work done never costs 0 s.
    Beyond the longest measured prefill the fit is not trusted: TTFT there is the fit at
    that length scaled by the model's FLOPs (`spec`), and a warning says how many requests
    were extrapolated.

    ```
    seconds |        measured . . fit       FLOP-scaled ....
            |      . ./                 ....
            | . ./        ........
            +--------------------|-------------------------> t
                               t_max (longest measured prefill)
    ```
    """

    COLUMNS = ("tokens_to_prefill", "cached_tokens", "seconds")

    def __init__(self, path: str | Path, spec: ModelSpec | None = None) -> None:
        rows = _read_profile(Path(path))
        t, c, s = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
        self.coef = nonnegative_fit(_features(t, c), s)
        measured = t > 0
        self.per_token = float((s[measured] / t[measured]).min()) if measured.any() else 0.0
        self.t_max = float(t.max())
        self.spec, self.path = spec, str(path)
        self.extrapolated = 0  # requests predicted beyond the measured range so far
        self._warned = False

    def _fit(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.maximum(_features(t, c) @ self.coef, self.per_token * t)

    def ttft(self, n_input: np.ndarray, hit: np.ndarray) -> np.ndarray:
        c = np.asarray(hit, dtype=np.float64)
        t = np.asarray(n_input, dtype=np.float64) - c
        out = self._fit(t, c)
        beyond = t > self.t_max
        if beyond.any():
            out[beyond] = self._extrapolate(t[beyond], c[beyond])
            self._warn(int(beyond.sum()), len(t))
        return out

    def _extrapolate(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        """The fit at t_max, scaled by the FLOPs of prefilling t rather than t_max tokens
        after c cached ones (by t itself when no model spec is known)."""
        edge = self._fit(np.full_like(t, self.t_max), c)
        if self.spec is None:
            return edge * t / max(self.t_max, 1.0)
        work = self.spec.flops_array(c + t) - self.spec.flops_array(c)
        base = self.spec.flops_array(c + self.t_max) - self.spec.flops_array(c)
        return edge * work / np.maximum(base, 1.0)

    def _warn(self, n: int, total: int) -> None:
        self.extrapolated += n
        if not self._warned:
            self._warned = True
            how = "the model's FLOPs" if self.spec is not None else "tokens (no model given)"
            print(f"warning: latency profile {self.path} measured prefills of up to "
                  f"{self.t_max:.0f} tokens; {n} of {total} requests prefill more and are "
                  f"extrapolated by {how}", file=sys.stderr)


def _features(t: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(t), t, t * t, t * c], axis=-1)


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (exact: the best feasible solution over
    every subset of free columns; x has a handful of columns)."""
    n = x.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y * y))
    for mask in range(1, 2**n):
        cols = [j for j in range(n) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        err = float(np.sum((x[:, cols] @ coef - y) ** 2))
        if err < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = coef
    return best


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
            value = float(row[name])
        except (TypeError, ValueError):
            raise ValueError(f"{path}, line {line}: field {name!r} is not a number: "
                             f"{row[name]!r}") from None
        if not 0 <= value < float("inf"):
            raise ValueError(f"{path}, line {line}: field {name!r} must be a finite number "
                             f">= 0, got {row[name]!r}")
        values.append(value)
    if values[0] > 0 and values[2] <= 0:
        raise ValueError(f"{path}, line {line}: {values[2]:g} seconds to prefill "
                         f"{values[0]:g} tokens: work done never takes 0 s")
    return values[0], values[1], values[2]
