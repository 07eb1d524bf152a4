"""What the offline reference's advantage is made of: admission or eviction, and within its
eviction, knowing whether an entry is reused or knowing when.

    .venv/bin/python experiments/bench_offline_parts.py [--set design|heldout] [--only KEY|CAP ...]

Each row replays one configuration of `bench_plus_unseen.py` (the same trace keys and
sets, `common.unseen_trace`) under hybrids of the offline reference's parts
(`marconi.sim.offline`) and the online ones, FLOPs saved %, paper-7b, bounds off, sequential:

- `sglang+`: judicious admission, LRU over leaves (online);
- `F adm + LRU`: the offline admission (a state only where a later input leaves the
  sequence) with sglang+'s LRU;
- `J + F evict`: judicious admission with the offline eviction (Belady by bytes / FLOPs),
  told also of leaves that two later inputs share in part (`branches`);
- `J + reused`: judicious admission with `ReuseOnlyEviction`, told only whether an entry
  is used again, not when (time since the last touch stands in for the distance);
- `offline`: both offline parts; `marconi+`, for scale.

`gap closed` = (X - sglang+) / (offline - sglang+) for `J + reused` and marconi+.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

from common import DESIGN, HELDOUT, unseen_saved

from marconi.core.policy import Admission, Eviction
from marconi.core.spec import ModelSpec
from marconi.paper.admission import Judicious
from marconi.paper.eviction import LRULeaf
from marconi.sim.future import FutureIndex
from marconi.sim.metrics import gap_closed
from marconi.sim.offline import FutureAdmission, JudiciousFutureEviction, ReuseOnlyEviction
from marconi.systems import System
from marconi.workload.types import Trace

Parts = Callable[[ModelSpec, FutureIndex], tuple[Admission, Eviction]]
HYBRIDS: dict[str, Parts] = {
    "F adm + LRU": lambda spec, future: (FutureAdmission(future), LRULeaf()),
    "J + F evict": lambda spec, future: (Judicious(), JudiciousFutureEviction(spec, future)),
    "J + reused": lambda spec, future: (Judicious(), ReuseOnlyEviction(spec, future)),
}
ONLINE = ("sglang+", "marconi+", "offline")


def saved(config: str, system: str) -> float:
    parts = HYBRIDS.get(system)
    if parts is None:
        return unseen_saved(config, system)

    def hybrid(trace: Trace) -> tuple[System, Callable[[int], None]]:
        future = FutureIndex([r.input_tokens for r in trace])

        def at(i: int) -> None:
            future.now = i

        return System(name=system, policies=lambda spec, alpha: parts(spec, future)), at

    return unseen_saved(config, system, hybrid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("design", "heldout"), default="design")
    parser.add_argument("--only", nargs="*", help="configurations (KEY|CAPACITY[|MODEL])")
    args = parser.parse_args()
    configs = args.only or (DESIGN if args.set == "design" else HELDOUT)
    systems = ("sglang+", "marconi+", *HYBRIDS, "offline")
    print(f"# {platform.machine()}, Python {platform.python_version()}; FLOPs saved %")
    print("| configuration | " + " | ".join(systems)
          + " | gap closed: J + reused / marconi+ |")
    print("|---" * (len(systems) + 2) + "|")
    for config in configs:
        row: dict[str, float] = {}
        for system in systems:
            start = time.perf_counter()
            row[system] = saved(config, system)
            print(f"  {config} {system}: {100 * row[system]:.2f}% "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        closed = [gap_closed(row[s], row["sglang+"], row["offline"])
                  for s in ("J + reused", "marconi+")]
        print(f"| {config} | " + " | ".join(f"{100 * row[s]:.2f}" for s in systems) + " | "
              + " / ".join("-" if c is None else f"{c:+.2f}" for c in closed) + " |",
              flush=True)


if __name__ == "__main__":
    main()
