"""Would marconi+'s evictions gain from sparse-prefix's checkpoint placement?

    .venv/bin/python experiments/bench_overlap_admission.py [--only KEY|CAPACITY[|MODEL] ...]

marconi+ loses to `sparse-prefix` on Mooncake's synthetic trace (experiments/RESULTS.md,
the fresh set), where admission is what matters. This runs sparse-prefix's admission
(`SparsePrefix`: per input at most `budget` states, at the overlap depths seen so far)
beside each eviction marconi+ can run (`Switchable` in one mode, no shadows), next to
sglang+, marconi+, `marconi+-overlap` (marconi+ with that placement as a fourth admission
expert among its shadows) and sparse-prefix itself (LRU over leaves), FLOPs saved %,
paper-7b unless named, bounds off, sequential. A diagnostic for that expert, not a test
of it: the default configurations are ones earlier sets already used.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

from common import unseen_saved

from marconi.core.policy import Admission, Eviction
from marconi.core.spec import ModelSpec
from marconi.paper.eviction import LRULeaf
from marconi.peers.sparse_prefix import SparsePrefix
from marconi.plus.switchable import Mode, Switchable
from marconi.systems import System

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="configurations (KEY|CAPACITY[|MODEL])")
    args = parser.parse_args()
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
