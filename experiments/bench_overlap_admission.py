"""Would marconi+'s evictions gain from sparse-prefix's checkpoint placement?

    .venv/bin/python experiments/bench_overlap_admission.py [--only KEY|CAPACITY[|MODEL] ...]
    .venv/bin/python experiments/bench_overlap_admission.py --switch [--response-time 10]

marconi+ loses to `sparse-prefix` on Mooncake's synthetic trace (experiments/RESULTS.md,
the fresh set), where admission is what matters. This runs sparse-prefix's admission
(`SparsePrefix`: per input at most `budget` states, at the overlap depths seen so far)
beside each eviction marconi+ can run (`Switchable` in one mode, no shadows), next to
sglang+, marconi+, `marconi+-overlap` (marconi+ with that placement as a fourth admission
expert among its shadows) and sparse-prefix itself (LRU over leaves), FLOPs saved %,
paper-7b unless named, bounds off, sequential. A diagnostic for that expert, not a test
of it: the default configurations are ones earlier sets already used.

`--switch`: what a switch into the overlap expert costs the live cache. On the sweep's
ShareGPT configuration at 4 GB, 1 session/s and the given response time (s), marconi+'s
experts none/depth and none/density beside overlap/density: the overlap expert run live
from the start, and the live cache switched to it once at request 16, 432 (where
marconi+-overlap followed it at 10 s) and never, with marconi+ and marconi+-overlap
themselves; FLOPs saved % and token hit rate per 250-request window.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

from common import cell, unseen_saved

from marconi.core.policy import Admission, Eviction
from marconi.core.spec import ModelSpec
from marconi.paper.eviction import LRULeaf
from marconi.peers.sparse_prefix import SparsePrefix
from marconi.plus.shadows import (
    Boundaries,
    Expert,
    ShadowConfig,
    ShadowReport,
    ShadowTuner,
    Switch,
    apply,
)
from marconi.plus.switchable import Mode, Switchable
from marconi.sim.sweep import simulate_cell
from marconi.systems import SYSTEMS, System, get_system

CONFIGS = ("mcs(a=0,b=2000)|40GB", "mcs(a=2000,b=3348)|80GB", "mc(a=7500,b=9500)|40GB",
           "mc(a=11000,b=12031)|60GB", "sg(sps=5)|2GB", "swe()|40GB")
Parts = Callable[[ModelSpec], tuple[Admission, Eviction]]
HYBRIDS: dict[str, Parts] = {
    "sp + lru (sparse-prefix)": lambda spec: (SparsePrefix(4), LRULeaf()),
    "sp + density": lambda spec: (SparsePrefix(4), Switchable(spec, Mode.DENSITY)),
    "sp + depth": lambda spec: (SparsePrefix(4), Switchable(spec, Mode.DEPTH)),
    "sp + gd": lambda spec: (SparsePrefix(4), Switchable(spec, Mode.FLOP)),
    "sp(budget 8) + density": lambda spec: (SparsePrefix(8), Switchable(spec, Mode.DENSITY)),
}
REGISTERED = ("sglang+", "marconi+", "marconi+-overlap")


def saved(config: str, system: str) -> float:
    parts = HYBRIDS.get(system)
    if parts is None:
        return unseen_saved(config, system)
    return unseen_saved(config, system, lambda trace: (
        System(name=system, policies=lambda spec, alpha: parts(spec)), None))


class SwitchOnce(ShadowTuner):
    """Shadows as marconi+'s, but the live cache runs the first expert and switches to the
    second once, after request `at` (None: never)."""

    at: int | None = None

    def _decide(self, cache: object) -> None:
        if self.seen == self.at:
            self.current = 1
            self.switches.append(Switch(self.seen, self.expert))
            apply(cache, self.expert)  # type: ignore[arg-type]


def switch_table(response_time: float) -> None:
    config = {"dataset": "sharegpt", "trace": "sharegpt", "capacity": "4GB",
              "model": "paper-7b", "sessions": "100", "max_requests": "", "sps": "1.0",
              "response_time": f"{response_time}", "mean_gap": "5.0", "seed": "0"}
    depth, density = Expert(Boundaries.NONE, Mode.DEPTH), Expert(Boundaries.NONE, Mode.DENSITY)
    overlap = Expert(Boundaries.OVERLAP, Mode.DENSITY)
    policies = get_system("marconi+-overlap").policies
    runs: list[tuple[str, str]] = [("marconi+", "marconi+"),
                                   ("marconi+-overlap", "marconi+-overlap")]

    def once(name: str, experts: tuple[Expert, ...], at: int | None) -> None:
        def tuner(options: object) -> ShadowTuner:
            made = SwitchOnce(ShadowConfig(experts=experts))
            made.at = at
            return made

        SYSTEMS.pop(name, None)
        SYSTEMS[name] = System(name=name, policies=policies, tuner=tuner)
        runs.append((name, name))

    once("overlap/density from the start", (overlap, depth, density), None)
    for at in (16, 432, None):
        once(f"none/depth, to overlap/density at {at}", (depth, overlap, density), at)
    print(f"# ShareGPT 4GB, 1 session/s, response time {response_time:g} s, paper-7b; "
          "FLOPs saved % and token hit rate per 250 requests")
    for label, name in runs:
        result = simulate_cell(cell(config, name))
        hits, inputs = result.records.hit, result.records.n_input
        windows = [float(hits[i:i + 250].sum() / inputs[i:i + 250].sum())
                   for i in range(0, len(hits), 250)]
        print(f"{label:40s} {100 * result.summary().flops_saved_rate:6.2f}  "
              + " / ".join(f"{w:.3f}" for w in windows), flush=True)
        report = result.tuning
        if name == "marconi+-overlap" and isinstance(report, ShadowReport):
            lead = sorted(report.totals.items(), key=lambda kv: -kv[1])[:3]
            print(f"  its switches {[(s.at, str(s.expert)) for s in report.switches]}; "
                  "leading shadows (FLOPs saved): "
                  + ", ".join(f"{e} {t:.3g}" for e, t in lead), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="configurations (KEY|CAPACITY[|MODEL])")
    parser.add_argument("--switch", action="store_true",
                        help="the cost of a switch into the overlap expert (ShareGPT)")
    parser.add_argument("--response-time", type=float, default=10.0)
    args = parser.parse_args()
    if args.switch:
        switch_table(args.response_time)
        return
    systems = (*REGISTERED, *HYBRIDS)
    print(f"# {platform.machine()}, Python {platform.python_version()}; FLOPs saved %")
    print("| configuration | " + " | ".join(systems) + " |")
    print("|---" * (len(systems) + 1) + "|")
    for config in args.only or CONFIGS:
        cells = []
        for system in systems:
            start = time.perf_counter()
            cells.append(100 * saved(config, system))
            print(f"  {config} {system}: {cells[-1]:.2f}% "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(f"| {config.replace('|', ' ')} | " + " | ".join(f"{c:.2f}" for c in cells)
              + " |", flush=True)


if __name__ == "__main__":
    main()
