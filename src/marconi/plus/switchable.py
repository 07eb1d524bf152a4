"""marconi+'s eviction: one policy per mode behind one interface, switchable at any time.

`Switchable` feeds every event to GreedyDual-FLOP (`marconi.plus.greedy_dual`), an
LRU-leaf policy, two hit-density policies (`marconi.plus.density`: leaves in one
class, or classed by depth) and Marconi's FLOP-aware eviction (`FlopAware`, its alpha set
by the tuner), so a tuner (`marconi.plus.shadows`) can switch among them without a pause:
the one `mode` names chooses the victims. Every policy's books (FlopAware's: the clock at
each candidate's last touch and its FLOP efficiency) depend on the tree's events only,
never on who chose the victims, so a switch finds each order as if it had run all along;
the one order that depends on its own victims, GreedyDual's level, is told of each victim
another expert chooses (`Eviction.follow`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from marconi.core.books import CoreBooks
from marconi.core.candidates import Declared
from marconi.core.compiled_forms import compiled_as
from marconi.core.policy import Eviction, Victim, check_alpha, overrides
from marconi.core.priority import Feature
from marconi.core.ranked import COUNTED
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node
from marconi.paper.eviction import FlopAware, LRULeaf
from marconi.plus.density import HitDensity
from marconi.plus.greedy_dual import GreedyDualFlop

DEPTH_CLASSES = 8  # Mode.DEPTH: leaves under 2K, 2-4K, ..., 64-128K, 128K+ tokens deep


class Mode(Enum):
    LRU = "lru"  # SGLang+: leaves, least recently used first (path touched)
    FLOP = "flop"  # GreedyDual-FLOP (or Marconi's recency + alpha x FLOP efficiency)
    DENSITY = "density"  # FLOP-weighted hit density (`marconi.plus.density`)
    DEPTH = "depth"  # the same, leaves classed by depth as well (a class per doubling)
    MARCONI = "marconi"  # Marconi's recency + alpha x FLOP efficiency at the setting's alpha


# the compiled core's number for each expert it runs (`Core::set_run`; FLOP: the score)
RUNS = {Mode.FLOP: 0, Mode.LRU: 1, Mode.DENSITY: 2, Mode.DEPTH: 3}


@dataclass(frozen=True, slots=True)
class Setting:
    """What a tuner chooses: an eviction mode and, for FLOP and MARCONI, an alpha."""

    mode: Mode
    alpha: float = 0.0

    def __str__(self) -> str:
        if self.mode is Mode.MARCONI:
            return f"marconi {self.alpha:g}"
        return self.mode.value if self.mode is not Mode.FLOP else f"{self.alpha:g}"


class Switchable(Eviction):
    """One eviction policy per mode, all fed the same events; `mode` picks the victim.

    All stay consistent at all times, so switching is free. The FLOP expert is
    GreedyDual-FLOP unless another policy is given (`flop`: one with an alpha takes the
    FLOP mode's); the MARCONI expert is Marconi's own score, kept only where something
    may switch to it (`marconi`), its alpha set with the mode.
    """

    def __init__(self, spec: ModelSpec, mode: Mode = Mode.FLOP, *,
                 flop: Eviction | None = None, depth: bool = True,
                 marconi: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.flop: Eviction = flop if flop is not None else GreedyDualFlop(spec)
        self.stamp = self.flop.stamp  # what a snapshot of this policy records
        # on a hybrid, `sglang+`'s LRU exactly (the judicious-LRU expert replays it); on a
        # Transformer (a node per block) blocks touched together leave tail first
        self.lru = LRULeaf(deepest_first=spec.ssm_layers == 0)
        self.density = HitDensity(spec)
        # the depth-classed expert costs a third of the event work: left out (depth=False)
        # where nothing will switch to Mode.DEPTH
        self.depth = self.depth_policy() if depth else None
        self.experts: dict[Mode, Eviction] = {Mode.FLOP: self.flop, Mode.LRU: self.lru,
                                              Mode.DENSITY: self.density}
        if self.depth is not None:
            self.experts[Mode.DEPTH] = self.depth
        # Marconi's score at any alpha: one more set of candidate columns, fed every event
        self.marconi = FlopAware(spec, 0.0) if marconi else None
        if self.marconi is not None:
            self.experts[Mode.MARCONI] = self.marconi
        # experts whose order depends on their own victims: told of the others' (`victim`)
        self._followers = {m: e for m, e in self.experts.items() if _follows(e)}
        self.alpha: float = self.flop.alpha or 0.0  # the FLOP mode's alpha
        self.mode = Mode.FLOP
        self.set_setting(Setting(Mode(mode), self.alpha))

    @property
    def compiled_as(self) -> str | None:
        """The compiled core runs it (`marconi.core.compiled`) as marconi+ builds it: a
        FLOP expert that evaluates a declared score with no alpha (GreedyDual-FLOP's, or
        any other whose form the compiled core maps and that reads no learned density:
        `compiled_forms.compiled_reason` says where not), LRU (a declaration of recency,
        depth and states: its stamps are its own, its hit counts not kept) and hit density
        (and by depth), each a declared score that reads no level and has no alpha (its
        stamps are the clock's), no FLOP-aware expert."""
        plain = (isinstance(self.flop, Declared) and compiled_as(self.flop) == "scored"
                 and not self.flop.score.tuned
                 and Feature.DENSITY not in self.flop.score.features
                 and type(self.lru) is LRULeaf
                 and not COUNTED & self.lru.priority.features
                 and all(type(d) is HitDensity and Feature.LEVEL not in d.score.features
                         and not d.score.tuned
                         for d in (self.density, self.depth) if d is not None)
                 and self.marconi is None)
        return "switchable" if plain else None

    def core_books(self) -> CoreBooks:
        """What the compiled core starts from: the LRU expert's declared keys, the FLOP
        expert's declared score and level, the hit density experts' declared scores and
        books (the depth-classed one's where kept), and the expert choosing."""
        flop = self.flop
        assert isinstance(flop, Declared)  # (`compiled_as`: the core runs no other)
        learned = (self.density, *((self.depth,) if self.depth is not None else ()))
        return CoreBooks(keys=self.lru.priority, score=flop.score, level=flop.level,
                         densities=tuple(d.compiled_books() for d in learned),
                         learned=tuple(d.score for d in learned), run=self.run)

    @property
    def run(self) -> int:
        """The compiled core's number for the expert choosing now (`Core::set_run`)."""
        return RUNS[self.mode]

    def set_setting(self, setting: Setting) -> None:
        if setting.mode not in self.experts:
            kept = "depth-classed" if setting.mode is Mode.DEPTH else "FLOP-aware (marconi)"
            raise ValueError(f"this Switchable keeps no {kept} expert; it cannot run "
                             f"{setting.mode}")
        self.mode = setting.mode
        if setting.mode is Mode.MARCONI:
            assert self.marconi is not None
            self.marconi.set_alpha(setting.alpha)
        else:
            self.set_alpha(setting.alpha)

    def set_alpha(self, alpha: float) -> None:
        """The FLOP mode's alpha, passed on to a FLOP expert that has one (GreedyDual-FLOP
        has none: its order is scale-free)."""
        alpha = check_alpha(alpha)
        if self.flop.alpha is not None:
            self.flop.set_alpha(alpha)
            alpha = self.flop.alpha
        self.alpha = alpha

    def depth_policy(self) -> HitDensity:
        """A fresh hit density with leaves classed by depth (the expert, or a shadow's)."""
        return HitDensity(self.spec, depth_classes=DEPTH_CLASSES)

    def solo(self, mode: Mode, alpha: float = 0.0) -> Eviction:
        """A fresh policy choosing the victims this one chooses in `mode` (at `alpha` for
        MARCONI), without the others (what a shadow cache of that mode needs)."""
        if mode is Mode.MARCONI:
            return FlopAware(self.spec, alpha)
        if mode is Mode.LRU:
            return LRULeaf(deepest_first=self.lru.deepest_first)
        if mode is Mode.DENSITY:
            return HitDensity(self.spec)
        if mode is Mode.DEPTH:
            return self.depth_policy()
        return self.flop.fresh(self.alpha)

    @property
    def setting(self) -> Setting:
        if self.mode is Mode.MARCONI and self.marconi is not None:
            return Setting(self.mode, self.marconi.alpha or 0.0)
        return Setting(self.mode, self.alpha if self.mode is Mode.FLOP else 0.0)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        path = tuple(path)
        for expert in self.experts.values():
            expert.on_lookup(path, hit, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        path, new = tuple(path), tuple(new)
        for expert in self.experts.values():
            expert.on_commit(path, new, now)

    def changed(self, node: Node) -> None:
        for expert in self.experts.values():
            expert.changed(node)

    def removed(self, node: Node) -> None:
        for expert in self.experts.values():
            expert.removed(node)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        for mode, expert in self._followers.items():
            if mode is not self.mode:
                expert.follow(now)
        return self.experts[self.mode].victim(protected, now)

    def check(self, nodes: Sequence[Node]) -> None:
        for expert in self.experts.values():
            expert.check(nodes)


def _follows(expert: Eviction) -> bool:
    """Whether `expert`'s order depends on its own victims, so that it is told of the
    others' (`follow`): a declared score's where it reads the level, another policy's where
    its class defines `follow`."""
    if isinstance(expert, Declared):
        return expert.score.leveled
    return overrides(expert, "follow")
