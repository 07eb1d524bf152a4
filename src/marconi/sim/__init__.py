"""Trace replay: every system through one loop, with the metrics of DESIGN section 7."""

from __future__ import annotations

from marconi.sim.latency import FlopsLatency, LatencyModel, ProfileLatency
from marconi.sim.replay import SimConfig, SimResult, simulate

__all__ = ["FlopsLatency", "LatencyModel", "ProfileLatency", "SimConfig", "SimResult", "simulate"]
