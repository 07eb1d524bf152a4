"""Trace replay: every system through one loop, with the metrics of docs/architecture.md."""

from __future__ import annotations

from marconi.sim.latency import FlopsLatency, LatencyModel, ProfileLatency
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig, SimResult
from marconi.sim.summary import Summary

__all__ = ["FlopsLatency", "LatencyModel", "ProfileLatency", "SimConfig", "SimResult", "Summary",
           "simulate"]
