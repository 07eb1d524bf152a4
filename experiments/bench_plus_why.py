"""Why marconi+ does what it does on one configuration: the figures behind the
explanations in `plus/density.py` and experiments/RESULTS.md.

    .venv/bin/python experiments/bench_plus_why.py TRACE CAPACITY MODEL

TRACE as `common.trace` names it. Prints:
- the workload's contention: sessions in flight at each arrival (median), and eviction
  candidates at each victim choice (median);
- hit density as built (`marconi+-density`) beside LHD's own estimate (the variant
  "density, no prior exposure" of bench_plus_variants.py): FLOPs saved, the idle age of
  the leaves each evicted (median, in clock ticks), and the real exposure its learned
  table held at age 0 at each relearn (median / max) against the pseudo-counts' prior
  exposure;
- marconi+'s shadow experts: every switch, the leader's lead over the running expert at
  each decision (the largest, and at the last decisions), and how far apart the
  experts' final totals are;
- the headroom of online eviction: Marconi's admission with an eviction told, for each
  candidate, *whether* a later request uses it (not when), dead entries first, then the
  least recently used or the least FLOP-efficient; beside sglang+ (LRU). What an online
  policy could gain by predicting which sessions have ended; and how well an input's depth
  predicts it (the share of calls at each depth that are their session's last).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `common`, loaded by path too
from bench_plus_variants import NoPrior  # the variants' plugin: registers them too
from common import trace

from marconi.core.policy import Victim
from marconi.core.spec import ModelSpec, resolve_model
from marconi.core.tree import Node
from marconi.paper.admission import Judicious
from marconi.plus.admission import PLAIN, Structured
from marconi.plus.density import HitDensity
from marconi.plus.shadows import ShadowConfig, ShadowTuner
from marconi.plus.switchable import Mode, Switchable
from marconi.sim.future import FutureIndex
from marconi.sim.offline import NEVER, FutureEviction
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.systems import Policies, PolicyFactory, System, register
from marconi.workload.types import Trace

RECORDS: dict[str, list[tuple[float, ...]]] = {"victims": [], "exposure": [], "leads": []}


def traced(base: type[HitDensity]) -> type[HitDensity]:
    """`base` recording each victim (idle age if a leaf, candidates) and each relearn."""

    class Traced(base):  # type: ignore[valid-type, misc]
        def victim(self, protected: Collection[Node], now: int) -> Victim | None:
            found = super().victim(protected, now)
            if found is not None:
                age = now - self.stamp.get(found.node, now) if found.node.is_leaf else -1
                RECORDS["victims"].append((age, len(self.columns)))
            return found

        def learn(self) -> None:
            n_above = np.cumsum(self.events[:, ::-1], axis=1)[:, ::-1]
            nt_above = np.cumsum((self.events * self.start)[:, ::-1], axis=1)[:, ::-1]
            real = (nt_above - n_above * self.start + n_above)[:, 0].sum()
            RECORDS["exposure"].append((real,))
            super().learn()

    return Traced


class LeadTuner(ShadowTuner):
    """marconi+'s tuner, recording the leader's lead at each decision."""

    def _decide(self, cache: object) -> None:
        best = float(self.totals.max())
        running = float(self.totals[self.current])
        RECORDS["leads"].append((self.seen, best / running - 1 if running > 0 else 0.0))
        super()._decide(cache)  # type: ignore[arg-type]


class KnowsWhether(FutureEviction):
    """Evicts the candidates no later request uses first (it knows whether, not when),
    then the least recently touched (`by_efficiency` False) or the one saving the fewest
    FLOPs per byte."""

    def __init__(self, spec: object, future: FutureIndex, by_efficiency: bool) -> None:
        super().__init__(spec, future)  # type: ignore[arg-type]
        self.by_efficiency = by_efficiency
        self.touched: dict[Node, int] = {}

    def on_lookup(self, path: object, hit: Node | None, now: int) -> None:
        self.touched.update((node, now) for node in path)  # type: ignore[attr-defined]

    def on_commit(self, path: object, new: object, now: int) -> None:
        self.touched.update((node, now) for node in path)  # type: ignore[attr-defined]
        super().on_commit(path, new, now)  # type: ignore[arg-type]

    def removed(self, node: Node) -> None:
        self.touched.pop(node, None)
        super().removed(node)

    def priority(self, now: int) -> np.ndarray:
        columns, n = self.columns, len(self.columns)
        if self.by_efficiency:
            order = columns["weight"][:n].copy()  # bytes freed per FLOP saved: largest first
        else:
            order = np.array([now - self.touched.get(node, 0) for node in columns.nodes[:n]],
                             dtype=np.float64)
        return order + (columns["next"][:n] >= NEVER) * 1e30


def knows_whether(loaded: Trace, config: SimConfig, by_efficiency: bool) -> float:
    """FLOPs saved by Marconi's admission with a `KnowsWhether` eviction."""
    future = FutureIndex([r.input_tokens for r in loaded])

    def at(i: int) -> None:
        future.now = i

    system = System(name="why/knows whether",
                    policies=lambda spec, alpha: (Judicious(),
                                                  KnowsWhether(spec, future, by_efficiency)),
                    description="bench_plus_why")
    return float(simulate(loaded, config, system=system, before=at)
                 .summary().flops_saved_rate)


def _traced_policies(cls: type[HitDensity]) -> PolicyFactory:
    def policies(spec: ModelSpec, alpha: float) -> Policies:
        return Structured(PLAIN), cls(spec)

    return policies


def _register() -> None:
    """The instrumented systems `main` replays, registered on import (this module is a
    plugin too: `--plugin experiments/bench_plus_why.py --system why/density`, which
    loads the variants' plugin itself: name it as well and they register twice)."""
    for name, base in (("why/density", HitDensity), ("why/no prior exposure", NoPrior)):
        register(System(name=name, policies=_traced_policies(traced(base)),
                        description="bench_plus_why"))
    register(System(
        name="why/marconi+",
        policies=lambda spec, alpha: (Structured(PLAIN), Switchable(spec, Mode.DENSITY)),
        tuner=lambda options: LeadTuner(ShadowConfig()), description="bench_plus_why"))


_register()


def last_call_share(loaded: Trace) -> str:
    """Per input-depth bin (doubling from 8K tokens): calls, and the share that end their
    session."""
    last: dict[str, int] = {}
    for i, r in enumerate(loaded):
        last[r.session_id] = i
    final = np.zeros(len(loaded), dtype=bool)
    final[list(last.values())] = True
    depth = np.array([r.n_input for r in loaded])
    edges = [0, 8192, 16384, 32768, 65536, np.inf]
    out = []
    for lo, hi in itertools.pairwise(edges):
        mask = (depth >= lo) & (depth < hi)
        if mask.any():
            out.append(f"{lo // 1024:.0f}K+ {mask.sum()} calls {final[mask].mean():.1%}")
    return "; ".join(out)


def in_flight(loaded: Trace) -> float:
    """Median over arrivals of the sessions begun and not yet ended."""
    spans: dict[str, list[float]] = {}
    for r in loaded:
        spans.setdefault(r.session_id, []).append(r.arrival)
    starts = np.sort([min(v) for v in spans.values()])
    ends = np.sort([max(v) for v in spans.values()])
    t = np.array([r.arrival for r in loaded])
    return float(np.median(np.searchsorted(starts, t, side="right")
                           - np.searchsorted(ends, t, side="left")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("capacity")
    parser.add_argument("model")
    args = parser.parse_args()
    loaded = trace(args.trace)
    spec = resolve_model(args.model)
    print(f"{args.trace}, {args.capacity}, {args.model}: {len(loaded)} requests, "
          f"sessions in flight at an arrival (median) {in_flight(loaded):.0f}")
    for system in ("why/density", "why/no prior exposure"):
        for key in RECORDS:
            RECORDS[key].clear()
        config = SimConfig(replay="sequential", retune=False,
                           spec=spec, capacity=args.capacity, system=system, bounds=False)
        saved = simulate(loaded, config).summary().flops_saved_rate
        victims = np.array(RECORDS["victims"]) if RECORDS["victims"] else np.zeros((1, 2))
        leaf_ages = victims[victims[:, 0] >= 0, 0]
        exposure = np.array(RECORDS["exposure"] or [(0.0,)])[:, 0]
        prior = HitDensity(spec).prior_exposure(0)
        label = system.removeprefix("why/")
        print(f"{label:22s} FLOPs saved {100 * saved:6.2f}%  evicted leaves idle "
              f"(median) {np.median(leaf_ages) if len(leaf_ages) else 0:.0f} ticks  "
              f"candidates (median) {np.median(victims[:, 1]):.0f}  real exposure at age 0 "
              f"median {np.median(exposure):.3g} / max {exposure.max():.3g} ticks "
              f"(prior {prior:.3g})")
    for key in RECORDS:
        RECORDS[key].clear()
    config = SimConfig(replay="sequential", retune=False,
                       spec=spec, capacity=args.capacity, system="why/marconi+",
                       bounds=False)
    result = simulate(loaded, config)
    assert result.tuning is not None
    tuning: dict[str, Any] = result.tuning.to_json()
    totals = np.array(list(tuning["totals"].values()))
    leads = RECORDS["leads"]
    top = max(leads, key=lambda x: x[1]) if leads else (0, 0.0)
    print(f"marconi+ FLOPs saved {100 * result.summary().flops_saved_rate:.2f}%; "
          f"switches {tuning['switches']}; running at the end {tuning['expert']}")
    print(f"  largest lead at a decision {100 * top[1]:+.1f}% (request {top[0]}); at the "
          "last decisions " + ", ".join(f"{100 * d:+.1f}% ({s})" for s, d in leads[-3:]))
    print(f"  final totals: best / worst expert {totals.max() / totals.min() - 1:+.2%}; "
          + ", ".join(f"{e} {v / totals.max():.3f}" for e, v in tuning["totals"].items()))
    config = SimConfig(replay="sequential", retune=False,
                       spec=spec, capacity=args.capacity, system="sglang+", bounds=False)
    lru = simulate(loaded, config).summary().flops_saved_rate
    print(f"headroom: sglang+ (LRU) {100 * lru:.2f}%; told whether an entry is used again: "
          f"then LRU {100 * knows_whether(loaded, config, False):.2f}%, then least "
          f"FLOP-efficient {100 * knows_whether(loaded, config, True):.2f}%")
    print(f"calls that end their session, by input depth: {last_call_share(loaded)}")


if __name__ == "__main__":
    main()
