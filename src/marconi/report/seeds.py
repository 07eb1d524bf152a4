"""`marconi compare --seeds K`: systems replayed under several arrival seeds.

One replay is one draw of the arrival process: on agent traces the best of several
policies can change with the seed, and a single run can crown a lucky one. This collects
each system's summary per seed and reports its mean, its range, and its paired margin
over the first system (the same seeds, so the seed's own effect cancels) with a Student t
95% confidence interval (`marconi.sim.metrics.paired_margin`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marconi.report.table import align
from marconi.sim.metrics import paired_margin
from marconi.sim.summary import Summary

MEANS = ("token_hit_rate", "request_hit_rate", "flops_saved_rate", "ttft_p50", "ttft_p95")
SUMS = ("refused_commits", "commits")  # over every seed: a refusal is never averaged away


class SeedComparison:
    """Summaries of several systems, one per (system, seed)."""

    def __init__(self, systems: Sequence[str]) -> None:
        if not systems:
            raise ValueError("SeedComparison needs at least one system")
        self.systems = list(systems)
        self.seeds: list[int] = []
        self.rows: dict[str, list[Summary]] = {s: [] for s in self.systems}

    def add(self, seed: int, summary: Summary) -> None:
        system = summary.system
        if system not in self.rows:
            raise ValueError(f"system {system!r} is not one of {self.systems}")
        if seed not in self.seeds:
            self.seeds.append(seed)
        self.rows[system].append(summary)

    def values(self, system: str, key: str = "flops_saved_rate") -> np.ndarray:
        return np.array([float(getattr(row, key)) for row in self.rows[system]])

    def _complete(self) -> None:
        counts = {s: len(r) for s, r in self.rows.items()}
        if len(set(counts.values())) != 1 or len(self.seeds) < 2 \
                or counts[self.systems[0]] != len(self.seeds):
            raise ValueError(f"need every system on the same >= 2 seeds; have {counts} runs "
                             f"for seeds {self.seeds}")

    def to_json(self) -> dict[str, Any]:
        self._complete()
        first = self.systems[0]
        out: dict[str, Any] = {"seeds": self.seeds, "baseline": first, "systems": []}
        for system in self.systems:
            saved = self.values(system)
            entry: dict[str, Any] = {"system": system, "flops_saved_rate": saved.tolist(),
                                     "token_hit_rate": self.values(system, "token_hit_rate")
                                     .tolist()}
            entry |= {f"{key}_mean": float(self.values(system, key).mean()) for key in MEANS}
            entry |= self._sums(system)
            if system != first:
                m = paired_margin(saved, self.values(first))
                entry["flops_saved_vs_baseline"] = {"mean": m.mean, "low": m.low,
                                                    "high": m.high}
            out["systems"].append(entry)
        return out

    def table(self) -> str:
        """One line per system: FLOPs saved mean and range, token hit rate, and the paired
        margin over the first system in points with its 95% CI."""
        self._complete()
        first = self.systems[0]
        header = ("system", "FLOPs saved mean", "min - max", "token hit mean",
                  "refused (all seeds)", f"vs {first}, points [95% CI]")
        cells = [header]
        for system in self.systems:
            saved = 100 * self.values(system)
            hit = 100 * self.values(system, "token_hit_rate")
            vs = "-" if system == first else str(paired_margin(saved, 100 * self.values(first)))
            sums = self._sums(system)
            cells.append((system, f"{saved.mean():.2f}%", f"{saved.min():.2f} - {saved.max():.2f}",
                          f"{hit.mean():.2f}%",
                          f"{sums['refused_commits']}/{sums['commits']}", vs))
        lines = [align(cells)]
        if all(np.ptp(self.values(s)) == 0 for s in self.systems):
            lines.append("every seed gave the same result: this trace's arrivals do not "
                         "depend on --seed")
        return "\n".join(lines)

    def mean_rows(self) -> list[dict[str, Any]]:
        """Summaries averaged over the seeds, refused and all commits summed over them (for
        `compare_plot`, whose labels name refusals)."""
        self._complete()
        return [{"system": s, **{k: float(self.values(s, k).mean()) for k in MEANS},
                 **self._sums(s)} for s in self.systems]

    def _sums(self, system: str) -> dict[str, int]:
        return {key: int(sum(getattr(row, key) or 0 for row in self.rows[system]))
                for key in SUMS}

    def spread(self) -> list[dict[str, tuple[float, float]]]:
        """Each system's (min, max) over the seeds of every averaged key (error bars)."""
        self._complete()
        return [{k: (float(self.values(s, k).min()), float(self.values(s, k).max()))
                 for k in MEANS} for s in self.systems]
