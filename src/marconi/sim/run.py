"""`run`: one replay of any system the simulator knows, references included."""

from __future__ import annotations

import sys

from marconi.sim.offline import offline, reuse_oracle
from marconi.sim.oracle import oracle
from marconi.sim.replay import simulate, with_inputs
from marconi.sim.result import OFFLINE, ORACLE, REUSE_ORACLE, SimConfig, SimResult
from marconi.sim.warnings import run_warnings
from marconi.systems import get_system
from marconi.workload.types import Trace


def check_reference(config: SimConfig) -> None:
    """ValueError for a reference that reads the trace's future (`offline`,
    `reuse-oracle`) under the serving replay: the future it reads is the sequential
    replay's (each request committed before the next), not what a schedule of
    overlapping requests lets a lookup see."""
    if config.system in (OFFLINE, REUSE_ORACLE) and config.replay == "serving":
        raise ValueError(f"{config.system} is a reference of the sequential replay (it "
                         "reads which later request reuses what, one request at a time); "
                         "run it with --replay sequential, beside systems replayed so too")


def run(trace: Trace, config: SimConfig, *, progress: bool = False,
        warn: bool = True) -> SimResult:
    """`simulate`, or a reference (`marconi-oracle`, `offline`, `reuse-oracle`) when
    `config.system` names one.
    `warn`: say on stderr when the run refused more than 1% of its commits, evicted for a
    commit it then refused (a policy bug), or dropped its bounds (they outgrew
    `config.bounds_tokens`). A system run by a real engine (`sglang-0.5.23`, `vllm-0.32`)
    is replayed through the engine's own code (marconi.engines.real). Requests with an
    empty input are dropped, and said (`replay.with_inputs`)."""
    trace = with_inputs(trace)  # type: ignore[assignment]  # a Trace stays a Trace
    check_reference(config)
    if config.system == ORACLE:
        result = oracle(trace, config)
    elif config.system == OFFLINE:
        result = offline(trace, config, progress=progress)
    elif config.system == REUSE_ORACLE:
        result = reuse_oracle(trace, config, progress=progress)
    elif (system := get_system(config.system)).engine is not None:
        from marconi.sim.real_engine import replay

        result = replay(trace, config, system, progress=progress)
    else:
        result = simulate(trace, config, progress=progress)
    if warn:
        for message in run_warnings(result.summary()):
            print(message, file=sys.stderr)
    return result
