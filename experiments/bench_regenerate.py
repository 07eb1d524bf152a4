"""Does admitting the state after every prompt pay for exact repeats (a "regenerate")?

    .venv/bin/python experiments/bench_regenerate.py

A temperature-0 regenerate sends a prompt again; the cache keeps no state after a prompt
alone (judicious admission: branch points and the end of input + output), so the repeat
hits the deepest state inside it, not the whole prompt. This replays ShareGPT (paper-7b)
with each request repeated right after itself with probability `rate` (same input, same
greedy output), under marconi and SGLang+ as they are and with the prompt end admitted as
well, at three capacities. The answer is in README's "Server" section.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import numpy as np

from marconi.core.spec import PAPER_7B, ModelSpec
from marconi.core.tree import Match
from marconi.paper.admission import Judicious
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.systems import Policies, System, get_system
from marconi.workload import load_trace
from marconi.workload.types import Request, Trace

RATES = (0.0, 0.1, 0.3)
CAPACITIES = ("1GB", "5GB", "20GB")


class PromptEnd(Judicious):
    """Judicious admission plus the state after the input."""

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        return tuple(sorted({*super().positions(match, n_total, n_input), n_input}))


def with_prompt_end(name: str) -> System:
    """The registered system `name`, its admission replaced by `PromptEnd`."""
    base = get_system(name)

    def policies(spec: ModelSpec, alpha: float) -> Policies:
        _, eviction = base.policies(spec, alpha)
        return PromptEnd(), eviction

    return dataclasses.replace(base, name=f"{name}+prompt-end", policies=policies)


def with_repeats(trace: Trace, rate: float, seed: int = 0) -> Trace:
    """`trace` with each request followed by an exact copy with probability `rate`."""
    rng, out = np.random.default_rng(seed), list[Request]()
    for request in trace:
        out.append(request)
        if rng.random() < rate:
            out.append(request)
    return Trace(f"{trace.name}+repeats{rate}", tuple(out))


def row(trace: Trace, rate: float, capacity: str, systems: Sequence[tuple[str, System]]) -> None:
    for name, system in systems:  # the registered name configures the cache's layout
        config = SimConfig(replay="sequential", retune=False,
                           spec=PAPER_7B, capacity=capacity, system=name, bounds=False)
        summary = simulate(trace, config, system=system).summary()
        print(f"{rate:>5}  {capacity:>8}  {system.name:<20}  {summary.token_hit_rate:9.4f}  "
              f"{summary.states_admitted:>6}", flush=True)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    trace = load_trace("sharegpt")
    print(f"ShareGPT: {len(trace)} requests, {trace.input_tokens} input tokens, paper-7b")
    print(f"{'rate':>5}  {'capacity':>8}  {'system':<20}  {'token hit':>9}  {'states':>6}")
    systems = [(name, s) for name in ("marconi", "sglang+")
               for s in (get_system(name), with_prompt_end(name))]
    for rate in RATES:
        for capacity in CAPACITIES:
            row(with_repeats(trace, rate), rate, capacity, systems)


if __name__ == "__main__":
    main()
