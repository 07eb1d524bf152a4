"""marconi+'s admission: Marconi's judicious checkpoints plus what the input's structure
and its history say will be reused.

- a checkpoint at the end of the first message(s) the trace or chat template knows (a
  system prompt: it then hits on its second occurrence, not its third), or at the
  input's last message boundary;
- a checkpoint where a lookup found KV beyond its hit (a partial hit) once that position
  repeats and the tokens it would save outweigh the state's bytes;
- with an overlap planner (`marconi.plus.overlap`, the `Boundaries.OVERLAP` expert of
  `marconi+-overlap`), the positions sparse prefix caching would place for the input,
  from the overlap depths of the requests before it, or, where it places none (a cold
  planner: nothing learnt overlaps the input yet), the input's first message boundary;
- for a model without SSM layers, a node every 32 tokens (vLLM's blocks).

```
| hit | ... boundary b (end of system prompt) ... | partial-hit m | ... | n_input |
0    hit                                                                  n_input
```
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from marconi.core.spec import ModelSpec
from marconi.core.tree import Match
from marconi.paper.admission import Block, Judicious
from marconi.plus.overlap import OverlapPlanner

ATTENTION_BLOCK = 32  # tokens per node when the model has no SSM layer (vLLM's block size)


@dataclass(frozen=True, slots=True, kw_only=True)
class StructureConfig:
    """Knobs of `Structured` admission (the ablation turns each off)."""

    # leading message boundaries to checkpoint (0: off); under `overlap`, only for an input
    # the planner places nothing in (a cold planner: a system prompt is checkpointed on its
    # first use, as the first-boundary expert does, not after the planner learnt its depth)
    boundaries: int = 1
    tail: bool = False  # checkpoint the input's last message boundary (its reusable end)
    partial: bool = True  # checkpoint repeated partial hits
    repeats: int = 2  # a partial-hit position is admitted on its `repeats`-th sighting
    min_gain: float = 1.0  # partial hit must save >= min_gain x (state bytes in KV tokens)
    memory: int = 4096  # partial-hit positions remembered (LRU)
    overlap: bool = False  # checkpoint where the overlap planner says (needs a planner)
    # the overlap planner's positions too, beside the others, each sequence kept whole
    # (marconi+'s first requests, before its experts' shadows tell which admission pays:
    # every admission's positions at once); needs a planner
    hedge: bool = False

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

    def __init__(self, config: StructureConfig | None = None,
                 planner: OverlapPlanner | None = None) -> None:
        self.min_tokens = 0.0  # set by `for_model`: the state's bytes in KV tokens
        self.blocks: Block | None = None  # set by `for_model` when states hold no SSM layer
        self._sightings: OrderedDict[bytes, int] = OrderedDict()
        # shared with the shadows' admissions and taught by the shadow tuner (`overlap`)
        self.planner = planner
        self._configure(config or StructureConfig())

    @property
    def compiled_as(self) -> str | None:  # type: ignore[override]
        """The compiled core runs it (`marconi.core.compiled`, the positions worked out
        here per request) unless it checkpoints partial hits (their sightings are kept
        here only)."""
        return None if self.config.partial else "structured"

    def extra_positions(self, key: bytes, n_input: int, boundaries: Sequence[int],
                        phase: str = "lookup") -> tuple[tuple[int, ...], bool]:
        """What a compiled cache's core needs of this admission for one request (`key`:
        at least its input's int32 bytes; `phase` is the same to it): the overlap
        planner's points for the input and True (its only positions, the sequence kept up
        to the last), or the message boundaries it checkpoints besides the judicious ones
        and False (each admitted where it lies past the hit, inside the input, not
        held)."""
        if self.config.overlap:
            return self._overlap(key, n_input, 0, boundaries), True
        config = self.config
        lead = [*boundaries[: config.boundaries], *(boundaries[-1:] if config.tail else ())]
        if config.hedge:
            lead = sorted({*lead, *(p for p in self._overlap(key, n_input, 0) if p < n_input)})
        return tuple(int(b) for b in lead), False

    def use_boundaries(self, *, first: bool, last: bool, overlap: bool = False,
                       hedge: bool = False) -> None:
        """Checkpoint the first message boundary, the last, both or neither from now on,
        and the overlap planner's positions or not (marconi+'s shadow experts switch
        this); `hedge`: the overlap planner's positions beside the boundaries, each
        sequence kept whole (`StructureConfig.hedge`)."""
        self._configure(dataclasses.replace(self.config, boundaries=int(first), tail=last,
                                            overlap=overlap, hedge=hedge))

    def _configure(self, config: StructureConfig) -> None:
        """Run `config` from now on (refused, the old one kept, if it needs a planner this
        admission lacks). Under the overlap planner a commit keeps a sequence up to its
        last state (`truncates`: KV beyond it serves no hybrid hit, as sparse prefix
        caching keeps it); otherwise all of it."""
        if (config.overlap or config.hedge) and self.planner is None:
            raise ValueError("Structured admission with overlap or hedge needs an overlap "
                             "planner (`planner`; marconi+'s shadow tuner attaches one)")
        if config.overlap and config.hedge:
            raise ValueError("Structured admission: overlap and hedge are exclusive (hedge "
                             "adds the overlap positions to the others)")
        self.config = config
        self.truncates = config.overlap

    def for_model(self, spec: ModelSpec) -> Structured:
        self.min_tokens = self.config.min_gain * spec.ssm_bytes / max(spec.kv_bytes_per_token, 1)
        # A Transformer has no state to size checkpoints by: a node per block costs nothing
        # and lets eviction trim a prefix from its tail (vLLM's block cache).
        self.blocks = Block(ATTENTION_BLOCK) if spec.ssm_layers == 0 else None
        return self

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        if self.config.overlap:  # partial hits still counted: a switch back finds them
            self._partial(match, n_input, hit, tokens, learn=True)
            return self._overlap(tokens, n_input, hit, boundaries)
        extra = self._extra(match, n_input, hit, boundaries, tokens, learn=True)
        if self.blocks is not None:
            extra.update(self.blocks.checkpoints(match, n_input, hit))
        return tuple(sorted({*self.checkpoints(match, n_input, hit), *extra}))

    def preview(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                tokens: bytes = b"") -> tuple[int, ...]:
        """`checkpoints_at` without remembering this sighting of a partial hit (a peek)."""
        if self.config.overlap:
            return self._overlap(tokens, n_input, hit, boundaries)
        extra = self._extra(match, n_input, hit, boundaries, tokens, learn=True, store=False)
        if self.blocks is not None:
            extra.update(self.blocks.checkpoints(match, n_input, hit))
        return tuple(sorted({*self.checkpoints(match, n_input, hit), *extra}))

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        if self.config.overlap:
            return self._overlap(tokens, n_input, 0, boundaries)
        hit = max((n.depth for n in match.path if n.has_state and n.depth <= n_input), default=0)
        extra = self._extra(match, n_input, hit, boundaries, tokens, learn=False)
        if self.blocks is not None:
            extra.update(self.blocks.positions(match, n_total, n_input))
        return tuple(sorted({*self.positions(match, n_total, n_input), *extra}))

    def _extra(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
               tokens: bytes, *, learn: bool, store: bool = True) -> set[int]:
        held = {n.depth for n in match.path if n.has_state}
        lead = [*boundaries[: self.config.boundaries],
                *(boundaries[-1:] if self.config.tail else ())]
        if self.config.hedge and tokens:
            lead.extend(self._overlap(tokens, n_input, hit))
        out = {b for b in lead if hit < b < n_input and b not in held}
        partial = self._partial(match, n_input, hit, tokens, learn=learn, store=store)
        if partial is not None and partial not in held:
            out.add(partial)
        return out

    def _overlap(self, tokens: bytes, n_input: int, above: int,
                 boundaries: Sequence[int] = ()) -> tuple[int, ...]:
        """The overlap planner's positions for the input, those deeper than `above`:
        sparse prefix caching's admission, all the overlap expert admits. Where the
        planner places none, the input's first `config.boundaries` message boundaries (of
        `boundaries`) in their place: the first requests of a trace overlap nothing yet,
        and a shared system prompt is then reused from its second use, not once the
        planner has learnt its depth (without it, on the system-prompt trace at 10% the
        first-boundary expert led to request 26 and marconi+ followed it, 4.4 points
        lost; experiments/RESULTS.md)."""
        assert self.planner is not None  # `_configure`
        if not tokens:
            raise ValueError("the overlap planner needs the input's tokens (checkpoints_at)")
        points = self.planner.points_of(tokens, n_input)
        if not points and self.config.boundaries:
            points = tuple(int(b) for b in boundaries[: self.config.boundaries]
                           if 0 < b <= n_input)
        return tuple(p for p in points if p > above)

    def _partial(self, match: Match, n_input: int, hit: int, tokens: bytes, *,
                 learn: bool, store: bool = True) -> int | None:
        """A position where KV matched well beyond the hit, seen `repeats` times (`learn`:
        counting this sighting, remembered unless `store` is False)."""
        m = min(match.length, n_input)
        if not self.config.partial or not tokens or m - hit < max(self.min_tokens, 1):
            return None
        key = hashlib.blake2b(tokens[: 4 * m], digest_size=16).digest()
        count = self._sightings.get(key, 0) + (1 if learn else 0)
        if learn and store:
            self._sightings[key] = count
            self._sightings.move_to_end(key)
            if len(self._sightings) > self.config.memory:
                self._sightings.popitem(last=False)
        return m if count >= self.config.repeats else None


PLAIN = StructureConfig(boundaries=0, partial=False)  # judicious; shadow experts add boundaries
