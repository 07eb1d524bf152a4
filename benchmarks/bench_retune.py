"""Overhead of marconi+'s guarded re-tuner: replay seconds per re-tune.

    .venv/bin/python benchmarks/bench_retune.py

Runs marconi+ over ShareGPT (2 GB) and the mini-swe-agent trajectories (20 GB) and prints,
per trace, the number of re-tunes, the window length and the replay seconds per re-tune
(all candidates, one process; with an executor of k workers the wall time divides by about
k). Replays run off the lookup path (`GuardedTuner(wait=False)` on an executor).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from marconi.sim.replay import SimConfig, simulate
from marconi.spec import PAPER_7B
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main() -> None:
    cases = [("sharegpt", "2GB", load_trace("sharegpt", options=TraceOptions(min_turns=10)))]
    if DATA.exists():
        cases.append(("swe-agent", "20GB", load_trace(DATA / "mini-swe-agent" / "trajs")))
    print(f"cores: {os.cpu_count()}")
    for name, capacity, trace in cases:
        config = SimConfig(spec=PAPER_7B, capacity=capacity, system="marconi+", bounds=False)
        result = simulate(trace, config)
        retunes = result.tuning.get("retunes", [])
        seconds = np.array([r["seconds"] for r in retunes])
        windows = np.array([r["window"] for r in retunes])
        print(f"{name} {capacity}: {len(trace)} requests, {len(retunes)} re-tunes, "
              f"window mean {windows.mean():.0f} requests, replay s/re-tune mean "
              f"{seconds.mean():.2f} max {seconds.max():.2f}, "
              f"per replayed request {1e3 * seconds.sum() / windows.sum():.2f} ms "
              f"({len(retunes[0]['scores'])} candidates); whole run {result.seconds:.1f} s")


if __name__ == "__main__":
    main()
