"""How marconi+'s pieces were chosen: variants of it on every sweep configuration.

    .venv/bin/python experiments/bench_plus_variants.py [--workers 2] [--only VARIANT ...]
    .venv/bin/python experiments/bench_plus_variants.py --one TRACE CAPACITY MODEL

Default: every variant below on the 53 configurations of `experiments/plus_vs_peers.toml`,
scored against the best of sglang+, sglang-2026, vllm-2026 and marconi as recorded in
`experiments/results/sweep.csv` (run `marconi reproduce --out experiments/results` first):
wins / ties (|margin| <= 0.01 point) / losses and the sum of margins. `--one` runs every
variant, and Marconi at fixed alphas, on one configuration (TRACE as `common.trace` names
it, or `synthetic:NAME` with 200 sessions). Each variant differs from marconi+ in one
piece.

The variants are not built-in systems: this module is a plugin that registers them on
import, so any command runs them by name once it loads the file, e.g.

    marconi simulate sharegpt --plugin experiments/bench_plus_variants.py --system "lead 1%"

(the other scripts here load it with `common.load_variants`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `common`, loaded by path too
from common import PEERS, cell, configurations, saved, trace

from marconi.core.policy import Eviction, Victim
from marconi.core.spec import ModelSpec, resolve_model
from marconi.core.tree import Node
from marconi.paper.eviction import FlopAware
from marconi.plus.admission import PLAIN, Structured
from marconi.plus.density import LEAF, PRIOR_HITS, HitDensity
from marconi.plus.greedy_dual import GreedyDualFlop
from marconi.plus.shadows import (
    DEFAULT_EXPERTS,
    MARCONI_ALPHAS,
    Boundaries,
    Expert,
    ShadowConfig,
    ShadowTuner,
)
from marconi.plus.switchable import Mode, Switchable
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.sim.sweep import run_cell
from marconi.systems import System, TunerFactory, TunerOptions, register
from marconi.workload import TraceOptions, load_trace


class OneClass(HitDensity):
    """Hit density without the leaf / interior split."""

    def changed(self, node: Node) -> None:
        super().changed(node)
        row = self.columns.index.get(node)
        if row is not None:
            self.columns["cls"][row] = LEAF


class FlatPrior(HitDensity):
    """Hit density that starts from a flat table (FLOP efficiency alone until it learns)."""

    def __init__(self, spec: object) -> None:
        super().__init__(spec)  # type: ignore[arg-type]
        self.density = np.ones_like(self.density)


class NoPrior(HitDensity):
    """Hit density as LHD estimates it: pseudo-counts only in the age buckets where
    events were seen (none over the empty tail), older ages extrapolated as 1 / age."""

    def learn(self) -> None:
        above = np.cumsum(self.hits[:, ::-1], axis=1)[:, ::-1]
        n_above = np.cumsum(self.events[:, ::-1], axis=1)[:, ::-1]
        nt_above = np.cumsum((self.events * self.start)[:, ::-1], axis=1)[:, ::-1]
        remaining = nt_above - n_above * self.start + n_above
        for c in range(len(self.events)):
            seen = np.nonzero(self.events[c] > 1e-6)[0]
            if len(seen):
                last = seen[-1]
                known = (above[c, :last + 1] + PRIOR_HITS) / np.maximum(
                    remaining[c, :last + 1], 1.0)
                self.density[c, :last + 1] = known
                self.density[c, last + 1:] = known[-1] * (self.start[last] + 1) / (
                    self.start[last + 1:] + 1)
        self.hits *= self.decay
        self.events *= self.decay


class HitsAhead(HitDensity):
    """Hit density reduced to its numerator: the decayed number of hits seen at idle
    ages >= a (no time in the cache at all)."""

    def learn(self) -> None:
        self.density = np.cumsum((self.hits + PRIOR_HITS)[:, ::-1], axis=1)[:, ::-1]
        self.hits *= self.decay
        self.events *= self.decay


class CostPower(GreedyDualFlop):
    """GreedyDual-FLOP with cost eff^power."""

    power = 1.0

    def scores(self, now: int) -> np.ndarray:
        n = len(self.columns)
        return self.columns["rec"][:n] + self.columns["eff"][:n] ** self.power


class FrozenLevel(Switchable):
    """marconi+'s eviction whose GreedyDual level does not follow the other experts."""

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        return self.experts[self.mode].victim(protected, now)


def _depth_classes(base: int, per_doubling: int, classes: int) -> type[Switchable]:
    """marconi+'s eviction whose depth classes start at `base` tokens, `per_doubling`
    classes per doubling, `classes` in all."""

    class Sized(Switchable):
        def __init__(self, spec: ModelSpec) -> None:
            super().__init__(spec, Mode.DENSITY)

        def depth_policy(self) -> HitDensity:
            return HitDensity(self.spec, depth_classes=classes, depth_base=base,
                              per_doubling=per_doubling)

    return Sized


class FixedAlpha(FlopAware):
    """Marconi's score with an alpha no setting changes."""

    def set_alpha(self, alpha: float) -> None:
        return None


def marconi_alpha_1(spec: ModelSpec) -> Switchable:
    """marconi+'s eviction whose FLOP order is Marconi's score with alpha fixed at 1."""
    return Switchable(spec, Mode.DENSITY, flop=FixedAlpha(spec, 1.0))


class NoEarlySwitch(ShadowTuner):
    """Shadow experts that make no decision at all during the warm-up."""

    def _decide(self, cache: object) -> None:
        if self.seen >= self.config.warmup:
            super()._decide(cache)  # type: ignore[arg-type]


def _tuner(tuner_class: type[ShadowTuner], config: ShadowConfig) -> TunerFactory:
    def tuner(options: TunerOptions) -> ShadowTuner:
        return tuner_class(config)

    return tuner


def _variant(name: str, eviction: Callable[[ModelSpec, float], Eviction],
             config: ShadowConfig | None = None,
             tuner_class: type[ShadowTuner] = ShadowTuner) -> str:
    register(System(name=name,
                    policies=lambda spec, alpha: (Structured(PLAIN), eviction(spec, alpha)),
                    tuner=None if config is None else _tuner(tuner_class, config),
                    description="benchmark variant"))
    return name


def _switchable(spec: ModelSpec, alpha: float) -> Switchable:
    return Switchable(spec, Mode.DENSITY)


def _power(power: float) -> Callable[[ModelSpec, float], GreedyDualFlop]:
    cls = type(f"CostPower{power}", (CostPower,), {"power": power})
    return lambda spec, alpha: cls(spec)


def _with_marconi(spec: ModelSpec, alpha: float) -> Switchable:
    """marconi+'s eviction that also keeps Marconi's FLOP-aware order (Mode.MARCONI)."""
    return Switchable(spec, Mode.DENSITY, marconi=True)


def _marconi_experts(alphas: tuple[float, ...], boundaries: tuple[Boundaries, ...] = (
        Boundaries.NONE,)) -> tuple[Expert, ...]:
    """marconi+'s experts and Marconi's eviction at each alpha as more experts."""
    return DEFAULT_EXPERTS + tuple(Expert(b, Mode.MARCONI, a) for b in boundaries
                                   for a in alphas)


GD_FIRST = tuple(sorted(DEFAULT_EXPERTS, key=lambda e: e.mode is not Mode.FLOP))
DEPTH_FIRST = tuple(sorted(DEFAULT_EXPERTS, key=lambda e: e.mode is not Mode.DEPTH))
# a bad start: the overlap experts run first (the guard's trap, experiments/RESULTS.md)
OVERLAP_FIRST = tuple(sorted(DEFAULT_EXPERTS, key=lambda e: e.boundaries is not Boundaries.OVERLAP))
FIRST_FIRST = tuple(sorted(DEFAULT_EXPERTS, key=lambda e: e.boundaries is not Boundaries.FIRST))
VARIANTS = (
    "marconi+", "marconi+-density", "marconi+-depth", "marconi+-gd", "marconi+-no-depth",
    "marconi+-no-density", "marconi+-overlap",
    _variant("depth classes from 512 tokens", lambda spec, alpha: _depth_classes(
        512, 1, 8)(spec), ShadowConfig()),
    _variant("depth classes per half doubling", lambda spec, alpha: _depth_classes(
        1024, 2, 16)(spec), ShadowConfig()),
    _variant("density, one class", lambda spec, alpha: OneClass(spec)),
    _variant("density, flat prior", lambda spec, alpha: FlatPrior(spec)),
    _variant("density, no prior exposure", lambda spec, alpha: NoPrior(spec)),
    _variant("density, hits ahead only", lambda spec, alpha: HitsAhead(spec)),
    _variant("gd, cost eff^0.5", _power(0.5)),
    _variant("gd, cost eff^2", _power(2.0)),
    _variant("lead 0.3%, no warm-up", _switchable, ShadowConfig(threshold=0.003, warmup=0)),
    _variant("lead 1%", _switchable, ShadowConfig(threshold=0.01)),
    _variant("warm-up, no early switch", _switchable, ShadowConfig(), NoEarlySwitch),
    _variant("gd runs first", lambda spec, alpha: Switchable(spec, Mode.FLOP),
             ShadowConfig(experts=GD_FIRST)),
    _variant("depth runs first", lambda spec, alpha: Switchable(spec, Mode.DEPTH),
             ShadowConfig(experts=DEPTH_FIRST)),
    _variant("overlap runs first", _switchable, ShadowConfig(experts=OVERLAP_FIRST)),
    # depth-classed hit density first, without the GreedyDual-FLOP experts (chosen under
    # the serving replay: experiments/RESULTS.md, "marconi+'s experts, served")
    # marconi+ starting on plain judicious admission in every replay (the serving replay
    # starts it on the first-boundary expert, as `marconi serve` does)
    _variant("plain judicious start", _switchable, ShadowConfig()),
    # sparse prefix caching's own configuration (its placement, LRU) as one more expert
    _variant("sparse-prefix as an expert", _switchable, ShadowConfig(
        experts=(*DEFAULT_EXPERTS, Expert(Boundaries.OVERLAP, Mode.LRU)))),
    _variant("first boundary first, sparse-prefix as an expert", _switchable, ShadowConfig(
        experts=(*FIRST_FIRST, Expert(Boundaries.OVERLAP, Mode.LRU)))),
    _variant("depth runs first, no gd", lambda spec, alpha: Switchable(spec, Mode.DEPTH),
             ShadowConfig(experts=tuple(e for e in DEPTH_FIRST if e.mode is not Mode.FLOP))),
    # the first message boundary checkpointed from the first request (a chat server's start)
    _variant("first boundary runs first", _switchable, ShadowConfig(experts=FIRST_FIRST)),
    # the warm-up's relative lead (marconi+: 5%, the lead after it; 25% until 2026-12-06:
    # experiments/RESULTS.md)
    *(_variant(f"warm-up lead {lead:.0%}", _switchable, ShadowConfig(early_threshold=lead))
      for lead in (1.0, 0.5, 0.25, 0.1, 0.05)),
    _variant("gd level frozen", lambda spec, alpha: FrozenLevel(spec, Mode.DENSITY),
             ShadowConfig()),
    _variant("marconi alpha 1 in place of gd", lambda spec, alpha: marconi_alpha_1(spec),
             ShadowConfig()),
    # FLOP-aware eviction at several alphas as more shadow experts (and decayed totals)
    _variant("marconi 0.5/1/2/4 as experts", _with_marconi,
             ShadowConfig(experts=_marconi_experts(MARCONI_ALPHAS))),
    _variant("marconi 0.5/1/2/4 at every boundary", _with_marconi,
             ShadowConfig(experts=_marconi_experts(MARCONI_ALPHAS, tuple(Boundaries)))),
    _variant("marconi 0.5/1 as experts", _with_marconi,
             ShadowConfig(experts=_marconi_experts((0.5, 1.0)))),
    _variant("marconi 1 as an expert", _with_marconi,
             ShadowConfig(experts=_marconi_experts((1.0,)))),
    _variant("totals half-life 256", _switchable, ShadowConfig(half_life=256)),
    _variant("totals half-life 512", _switchable, ShadowConfig(half_life=512)),
    _variant("totals half-life 1024", _switchable, ShadowConfig(half_life=1024)),
    _variant("marconi 0.5/1/2/4, half-life 256", _with_marconi,
             ShadowConfig(experts=_marconi_experts(MARCONI_ALPHAS), half_life=256)),
    _variant("marconi 0.5/1/2/4, half-life 512", _with_marconi,
             ShadowConfig(experts=_marconi_experts(MARCONI_ALPHAS), half_life=512)),
    _variant("marconi 0.5/1/2/4, half-life 1024", _with_marconi,
             ShadowConfig(experts=_marconi_experts(MARCONI_ALPHAS), half_life=1024)),
    _variant("marconi 0.5/1, half-life 512", _with_marconi,
             ShadowConfig(experts=_marconi_experts((0.5, 1.0)), half_life=512)),
)


def _run(job: tuple[dict[str, str], str]) -> float:
    row = run_cell(cell(*job))
    if row["status"] != "ok":
        raise RuntimeError(f"{job[1]}: {row['error']}")
    return float(row["flops_saved_rate"])


def sweep_table(workers: int, only: Collection[str] = ()) -> None:
    unknown = set(only) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--only: unknown variant(s) {sorted(unknown)}; known: {VARIANTS}")
    variants = tuple(v for v in VARIANTS if not only or v in only)
    configs = configurations()
    configs.sort(key=lambda c: c[0]["dataset"] != "swe-agent")  # long jobs first
    jobs = [(p, v) for p, _ in configs for v in variants]
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_run, jobs))
    print(f"{len(configs)} configurations; margin = variant - best peer, points")
    print("| variant | wins / ties / losses | sum of margins | worst margin |")
    print("|---|---|---|---|")
    for i, name in enumerate(variants):
        margins = [100 * (results[k * len(variants) + i] - best)
                   for k, (_, best) in enumerate(configs)]
        wins = sum(m > 0.01 for m in margins)
        losses = sum(m < -0.01 for m in margins)
        print(f"| {name} | {wins} / {len(margins) - wins - losses} / {losses} | "
              f"{sum(margins):+.1f} | {min(margins):+.2f} |")
    print("\nlosses (margin < -0.01 point):")
    for i, name in enumerate(variants):
        lost = [f"{_where(p)} {100 * (results[k * len(variants) + i] - best):+.2f}"
                for k, (p, best) in enumerate(configs)
                if 100 * (results[k * len(variants) + i] - best) < -0.01]
        print(f"- {name}: {'; '.join(lost) or 'none'}")


def _where(p: dict[str, str]) -> str:
    model = p["model"].replace("paper-7b", "").lstrip(",")
    return " ".join(x for x in (p["dataset"], p["capacity"], model, f"{p['sps']} sps") if x)


def _one(job: tuple[str, str, str, str]) -> float:
    name, capacity, system, model = job
    if not name.startswith("synthetic:"):
        return saved(job)
    system, _, alpha = system.partition("@")
    loaded = load_trace(name, options=TraceOptions(sessions=200))
    config = SimConfig(replay="sequential", retune=False,
                       spec=resolve_model(model), capacity=capacity, system=system,
                       bounds=False, alpha=float(alpha) if alpha else None)
    return float(simulate(loaded, config).summary().flops_saved_rate)


def one_table(name: str, capacity: str, model: str, workers: int) -> None:
    systems = (*PEERS, *VARIANTS)
    jobs = [(name, capacity, s, model) for s in systems]
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_one, jobs))
    print(f"{name}, {capacity}, {model}: FLOPs saved %")
    for system, value in zip(systems, results, strict=True):
        print(f"{system:34s} {100 * value:6.2f}")
    if not name.startswith("synthetic:"):
        alphas = (0.0, 0.5, 1.0, 1.5, 2.0)
        loaded = trace(name)
        for alpha in alphas:
            config = SimConfig(replay="sequential", retune=False,
                               spec=resolve_model(model), capacity=capacity, system="marconi",
                               alpha=alpha, bounds=False)
            value = simulate(loaded, config).summary().flops_saved_rate
            print(f"{f'marconi, alpha {alpha:g}':34s} {100 * value:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--one", nargs=3, metavar=("TRACE", "CAPACITY", "MODEL"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], metavar="VARIANT",
                        help="sweep table: run only this variant (repeatable)")
    args = parser.parse_args()
    if args.one:
        name, capacity, model = args.one
        one_table(name, capacity, model, args.workers)
    else:
        sweep_table(args.workers, args.only)


if __name__ == "__main__":
    main()
