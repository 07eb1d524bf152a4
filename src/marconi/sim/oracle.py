"""`marconi-oracle`: Marconi with the best static alpha in hindsight (an upper reference).

Replays the whole trace once per alpha of the grid and keeps the best by FLOPs saved.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass

from marconi.paper.tuner import GRID
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig, SimResult
from marconi.workload.types import Trace


@dataclass(frozen=True, slots=True)
class OracleReport:
    """The best alpha and the FLOPs every alpha of the grid saved."""

    alpha: float
    scores: dict[float, float]
    replay_seconds: float = 0.0  # the replays' own times, summed

    def to_json(self) -> dict[str, object]:
        return {"alpha": self.alpha, "scores": {str(a): s for a, s in self.scores.items()}}


def _one(trace: Trace, config: SimConfig, alpha: float) -> SimResult:
    return simulate(trace, dataclasses.replace(config, system="marconi", alpha=alpha))


def oracle(trace: Trace, config: SimConfig, *, grid: tuple[float, ...] = GRID,
           executor: Executor | None = None) -> SimResult:
    """Best fixed-alpha Marconi replay of `trace`; `tuning.scores` holds every alpha's.

    Its `seconds` is the wall time of all the replays (one per alpha), not the best one's.
    """
    start = time.perf_counter()
    pool = executor or ProcessPoolExecutor(max_workers=min(len(grid), os.cpu_count() or 1))
    try:
        results = list(pool.map(_one, [trace] * len(grid), [config] * len(grid), grid))
    finally:
        if executor is None:
            pool.shutdown()
    scores = {a: float(config.spec.flops_array(r.records.hit).sum())
              for a, r in zip(grid, results, strict=True)}
    best_alpha = max(scores, key=lambda a: (scores[a], -a))
    best = results[grid.index(best_alpha)]
    best.config = dataclasses.replace(config, alpha=best_alpha)
    best.tuning = OracleReport(best_alpha, scores, sum(r.seconds for r in results))
    best.seconds = time.perf_counter() - start
    return best
