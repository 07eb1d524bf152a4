"""`run`: one replay of any system the simulator knows, references included."""

from __future__ import annotations

from marconi.sim.offline import offline
from marconi.sim.oracle import oracle
from marconi.sim.replay import simulate
from marconi.sim.result import OFFLINE, ORACLE, SimConfig, SimResult
from marconi.workload.types import Trace


def run(trace: Trace, config: SimConfig, *, progress: bool = False) -> SimResult:
    """`simulate`, or the oracle / offline reference when `config.system` names one."""
    if config.system == ORACLE:
        return oracle(trace, config)
    if config.system == OFFLINE:
        return offline(trace, config, progress=progress)
    return simulate(trace, config, progress=progress)
