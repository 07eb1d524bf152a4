"""`marconi+`: Marconi made safe to turn on everywhere (issue 8).

Two policies, each a small extension of Marconi's:

- `Structured` admission: Judicious, plus a checkpoint at the end of the first message(s)
  the trace or chat template knows (a system prompt: it then hits on its second
  occurrence, not its third), plus a checkpoint where a lookup found KV beyond its hit
  (a partial hit) once that position repeats and the tokens it would save outweigh the
  state's bytes. For a model without SSM layers, a node every 32 tokens (vLLM's blocks).
- `Switchable` eviction: FLOP-aware eviction (Marconi's score or GreedyDual-FLOP) that
  keeps an LRU-leaf twin and two hit-density twins (`marconi.policies.density`: leaves in
  one class, or classed by depth) up to date, so a tuner (`marconi.shadows`,
  `marconi.retuner`) can switch between them at any time.

```
| hit | ... boundary b (end of system prompt) ... | partial-hit m | ... | n_input |
0    hit                                                                  n_input
```
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from marconi.policies.admission import Block, Judicious
from marconi.policies.density import HitDensity
from marconi.policies.eviction import Eviction, FlopAware, LRULeaf, Recency, Victim
from marconi.spec import ModelSpec
from marconi.tree import Match, Node

ATTENTION_BLOCK = 32  # tokens per node when the model has no SSM layer (vLLM's block size)
DEPTH_CLASSES = 8  # Mode.DEPTH: leaves under 2K, 2-4K, ..., 64-128K, 128K+ tokens deep


@dataclass(frozen=True, slots=True, kw_only=True)
class StructureConfig:
    """Knobs of `Structured` admission (the ablation turns each off)."""

    boundaries: int = 1  # leading message boundaries to checkpoint (0: off)
    tail: bool = False  # checkpoint the input's last message boundary (its reusable end)
    partial: bool = True  # checkpoint repeated partial hits
    repeats: int = 2  # a partial-hit position is admitted on its `repeats`-th sighting
    min_gain: float = 1.0  # partial hit must save >= min_gain x (state bytes in KV tokens)
    memory: int = 4096  # partial-hit positions remembered (LRU)

    def __post_init__(self) -> None:
        if self.boundaries < 0:
            raise ValueError(f"boundaries must be >= 0, got {self.boundaries!r}")
        if self.repeats < 1 or self.memory < 1:
            raise ValueError(f"repeats and memory must be >= 1, got {self.repeats}, {self.memory}")
        if self.min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain!r}")


class Structured(Judicious):
    """Judicious admission plus message-boundary and learned partial-hit checkpoints.

    Stateful (it remembers partial-hit positions): one instance per cache.
    """

    def __init__(self, config: StructureConfig | None = None) -> None:
        self.config = config or StructureConfig()
        self.min_tokens = 0.0  # set by `for_model`: the state's bytes in KV tokens
        self.blocks: Block | None = None  # set by `for_model` when states hold no SSM layer
        self._sightings: OrderedDict[bytes, int] = OrderedDict()

    def for_model(self, spec: ModelSpec) -> Structured:
        self.min_tokens = self.config.min_gain * spec.ssm_bytes / max(spec.kv_bytes_per_token, 1)
        # A Transformer has no state to size checkpoints by: a node per block costs nothing
        # and lets eviction trim a prefix from its tail (vLLM's block cache).
        self.blocks = Block(ATTENTION_BLOCK) if spec.ssm_layers == 0 else None
        return self

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        extra = self._extra(match, n_input, hit, boundaries, tokens, learn=True)
        if self.blocks is not None:
            extra.update(self.blocks.checkpoints(match, n_input, hit))
        return tuple(sorted({*self.checkpoints(match, n_input, hit), *extra}))

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        hit = max((n.depth for n in match.path if n.has_state and n.depth <= n_input), default=0)
        extra = self._extra(match, n_input, hit, boundaries, tokens, learn=False)
        if self.blocks is not None:
            extra.update(self.blocks.positions(match, n_total, n_input))
        return tuple(sorted({*self.positions(match, n_total, n_input), *extra}))

    def _extra(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
               tokens: bytes, *, learn: bool) -> set[int]:
        held = {n.depth for n in match.path if n.has_state}
        lead = [*boundaries[: self.config.boundaries],
                *(boundaries[-1:] if self.config.tail else ())]
        out = {b for b in lead if hit < b < n_input and b not in held}
        partial = self._partial(match, n_input, hit, tokens, learn=learn)
        if partial is not None and partial not in held:
            out.add(partial)
        return out

    def _partial(self, match: Match, n_input: int, hit: int, tokens: bytes, *,
                 learn: bool) -> int | None:
        """A position where KV matched well beyond the hit, seen `repeats` times."""
        m = min(match.length, n_input)
        if not self.config.partial or not tokens or m - hit < max(self.min_tokens, 1):
            return None
        key = hashlib.blake2b(tokens[: 4 * m], digest_size=16).digest()
        count = self._sightings.get(key, 0) + (1 if learn else 0)
        if learn:
            self._sightings[key] = count
            self._sightings.move_to_end(key)
            if len(self._sightings) > self.config.memory:
                self._sightings.popitem(last=False)
        return m if count >= self.config.repeats else None


class Mode(Enum):
    LRU = "lru"  # SGLang+: leaves, least recently used first (path touched)
    FLOP = "flop"  # Marconi: recency + alpha x FLOP efficiency (or GreedyDual-FLOP)
    DENSITY = "density"  # FLOP-weighted hit density (`marconi.policies.density`)
    DEPTH = "depth"  # the same, leaves classed by depth as well (a class per doubling)


@dataclass(frozen=True, slots=True)
class Setting:
    """What the tuner chooses: an eviction mode and, for FLOP, an alpha."""

    mode: Mode
    alpha: float = 0.0

    def __str__(self) -> str:
        return self.mode.value if self.mode is not Mode.FLOP else f"{self.alpha:g}"


class Switchable(FlopAware):
    """FLOP-aware eviction with an LRU-leaf twin and two hit-density twins fed the same
    events; `mode` picks the victim. All stay consistent at all times, so switching is
    free."""

    def __init__(self, spec: ModelSpec, alpha: float = 0.0, mode: Mode = Mode.FLOP,
                 recency: Recency = Recency.TIME, *, depth: bool = True) -> None:
        super().__init__(spec, alpha, recency)
        self.lru = LRULeaf(deepest_first=True)  # blocks touched together leave tail first
        self.density = HitDensity(spec)
        # the depth-classed twin costs a third of the event work: left out (depth=False)
        # where nothing will switch to Mode.DEPTH
        self.depth = self.depth_policy() if depth else None
        self.twins: tuple[Eviction, ...] = (self.lru, self.density, *filter(None, [self.depth]))
        self.mode = Mode.FLOP
        self.set_setting(Setting(Mode(mode), alpha))

    def set_setting(self, setting: Setting) -> None:
        if setting.mode is Mode.DEPTH and self.depth is None:
            raise ValueError("this Switchable keeps no depth-classed twin (depth=False); "
                             "it cannot run Mode.DEPTH")
        self.mode = setting.mode
        self.set_alpha(setting.alpha)

    def depth_policy(self) -> HitDensity:
        """A fresh hit density with leaves classed by depth (the twin, or a shadow's)."""
        return HitDensity(self.spec, depth_classes=DEPTH_CLASSES)

    def solo(self, mode: Mode) -> Eviction:
        """A fresh policy choosing the victims this one chooses in `mode`, without twins
        (what a shadow cache of that mode needs)."""
        if mode is Mode.LRU:
            return LRULeaf(deepest_first=self.lru.deepest_first)
        if mode is Mode.DENSITY:
            return HitDensity(self.spec)
        if mode is Mode.DEPTH:
            return self.depth_policy()
        return FlopAware(self.spec, self.alpha, self.recency)

    @property
    def setting(self) -> Setting:
        return Setting(self.mode, self.alpha if self.mode is Mode.FLOP else 0.0)

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        path = tuple(path)
        super().on_lookup(path, hit, now)
        for twin in self.twins:
            twin.on_lookup(path, hit, now)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        path, new = tuple(path), tuple(new)
        super().on_commit(path, new, now)
        for twin in self.twins:
            twin.on_commit(path, new, now)

    def changed(self, node: Node) -> None:
        super().changed(node)
        for twin in self.twins:
            twin.changed(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        for twin in self.twins:
            twin.removed(node)

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if self.mode is not Mode.FLOP and self.recency is Recency.GREEDY_DUAL and self.slots:
            # GreedyDual's level follows the evictions it does not choose, to where its own
            # victim would have put it, so that a switch to it finds a live recency order
            # (frozen at 0, it would rank by efficiency alone until the level caught up)
            self.level = max(self.level, float(self.scores(now).min()))
        if self.mode is Mode.LRU:
            return self.lru.victim(protected, now)
        if self.mode is Mode.DENSITY:
            return self.density.victim(protected, now)
        if self.mode is Mode.DEPTH and self.depth is not None:
            return self.depth.victim(protected, now)
        return super().victim(protected, now)
