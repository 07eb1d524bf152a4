"""SGLang 0.5.23's hybrid prefix cache (`UnifiedRadixCache`), emulated as a peer baseline
(checked against the real code: `marconi.engines.real`, docs/peers.md).

Admission (where the engine saves a state), per request whose lookup hit `h` (at most
`n_input - 1`: one input token is always computed):

```
no-buffer:     | hit | chunk | chunk | ... | last chunk | output ...... |
               0     h   h+C     h+2C        n_input     n_total - 1
               states at every chunk end, at n_input (after prefill) and n_total - 1
               (the last sampled token is never fed)
extra-buffer:  one tracked state per prefill chunk: the chunk's last multiple of T
               (T = 64 tokens) or, in the chunk holding it, the branch point
               floor(matched / T) * T; then every `decode_interval` tokens of decode;
               the sequence is kept only up to the last tracked state.
```
Eviction: two LRU lists (`MambaRadixLRU`). See docs/peers.md for what is not modelled.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from enum import Enum

from marconi.core.books import CoreBooks
from marconi.core.layout import Layout
from marconi.core.policy import Action, Admission, Victim, alive, check_alpha
from marconi.core.priority import Lists, ListVictim, Score
from marconi.core.scores import ListScore
from marconi.core.spec import ModelSpec
from marconi.core.tree import Match, Node
from marconi.peers.two_lists import FlopStates, TwoListLRU


class BufferMode(Enum):
    NO_BUFFER = "no-buffer"  # --mamba-scheduler-strategy no_buffer (page size 1)
    EXTRA_BUFFER = "extra-buffer"  # ping-pong track buffers, chunk-aligned states


@dataclass(frozen=True, slots=True, kw_only=True)
class SGLangConfig:
    """Knobs of SGLang's MambaRadixCache; defaults are SGLang's for an H100/H200."""

    mode: BufferMode = BufferMode.NO_BUFFER  # auto picks no_buffer for Mamba2 models
    chunk: int = 8192  # --chunked-prefill-size: 8192 below 160 GB of GPU memory
    track: int = 64  # mamba_cache_chunk_size = max(mamba_chunk_size or FLA's 64, page)
    decode_interval: int = 256  # --mamba-track-interval: decode states (extra-buffer)
    state_share: float = 0.9 / 1.9  # states' share of capacity: --mamba-full-memory-ratio 0.9
    max_states_per_path: int | None = None  # --mamba-max-states-per-path (off by default)

    def __post_init__(self) -> None:
        for name in ("chunk", "track", "decode_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SGLangConfig.{name} must be a positive integer, got {value!r}")
        if not 0.0 <= self.state_share <= 1.0:
            raise ValueError(f"SGLangConfig.state_share must be in [0, 1], got {self.state_share}")
        cap = self.max_states_per_path
        if cap is not None and (not isinstance(cap, int) or cap <= 0):
            raise ValueError(f"SGLangConfig.max_states_per_path must be positive, got {cap!r}")
        if not isinstance(self.mode, BufferMode):
            raise ValueError(f"SGLangConfig.mode must be a BufferMode, got {self.mode!r}")


def sglang_layout(spec: ModelSpec, capacity: int, config: SGLangConfig | None = None) -> Layout:
    """SGLang's memory at `capacity` bytes: KV in pages of one token beside a mamba pool
    sized from `state_share` of the memory (`--mamba-full-memory-ratio` 0.9: states / KV)
    as `_handle_max_mamba_cache` sizes it: `(budget - state) // state` slots, one state's
    memory more kept as its padding slot (`sglang_memory`). The running request's working
    slots come out of the pool. The byte budget when the share holds no state."""
    share = (config or SGLangConfig()).state_share
    slots = int((capacity * share - spec.ssm_bytes) // spec.ssm_bytes) if spec.ssm_bytes else 0
    return Layout(page_size=1, state_slots=max(slots, 0))


def sglang_memory(spec: ModelSpec, capacity: int) -> tuple[ModelSpec, int]:
    """What SGLang's pools amount to: the capacity less its mamba pool's padding slot."""
    if not spec.ssm_bytes or capacity >= 2**62:  # unbounded (the bounds' cache)
        return spec, capacity
    return spec, max(capacity - spec.ssm_bytes, 0)


def deepest_state(match: Match, limit: int) -> int:
    """Depth of the deepest matched state within `limit` tokens (0: none)."""
    return max((n.depth for n in match.path if n.has_state and n.depth <= limit), default=0)


class MambaRadix(Admission):
    """States at chunk ends and request ends; in extra-buffer mode, chunk-aligned."""

    compiled_as = "radix"  # marconi.core.compiled runs it (with SGLang's two lists)

    def __init__(self, config: SGLangConfig | None = None) -> None:
        self.config = config or SGLangConfig()
        # the final insert covers what was computed, every token but the last sampled one
        # (no-buffer: up to its state there); extra-buffer: up to its last tracked state
        self.truncates = True

    def max_hit(self, n_input: int) -> int:
        """SGLang leaves one input token to compute (`init_next_round_input`)."""
        return n_input - 1

    def running(self, n_total: int) -> tuple[int, int]:
        """Extra-buffer: the running request also holds two ping-pong tracking slots
        (`get_mamba_tracking_slots`), so the tree keeps two states fewer meanwhile."""
        return 0, 2 if self.config.mode is BufferMode.EXTRA_BUFFER else 0

    def branch(self, match: Match, n_input: int, hit: int) -> int | None:
        """SGLang's `mamba_branching_seqlen`: KV matched past the hit, rounded down to T."""
        matched = min(match.length, n_input)
        aligned = matched // self.config.track * self.config.track
        return aligned if matched > hit and aligned > 0 else None

    def prefill(self, match: Match, n_input: int, hit: int) -> list[int]:
        """States saved while prefilling (hit, n_input], one chunk at a time."""
        c = self.config
        starts = range(hit, n_input, c.chunk)
        if c.mode is BufferMode.NO_BUFFER:
            return [*(s + c.chunk for s in starts if s + c.chunk < n_input), n_input]
        branch = self.branch(match, n_input, hit)
        out = []
        for s in starts:
            e = min(s + c.chunk, n_input)
            if branch is not None and s < branch <= e:
                out.append(branch)  # forced track replaces the chunk's own
            elif e - s >= c.track:
                out.append(s + (e - s) // c.track * c.track)
        return out

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        return tuple(p for p in self.prefill(match, n_input, hit) if p > hit)

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        hit = deepest_state(match, self.max_hit(n_input))
        out = set(self.prefill(match, n_input, hit))
        if self.config.mode is BufferMode.NO_BUFFER:
            out.add(max(n_total - 1, n_input))  # the last sampled token is never fed
        else:
            step = self.config.decode_interval
            last = n_total // step * step
            if last > n_input:
                out.add(last)  # the last state tracked during decode
        return tuple(sorted(p for p in out if p > 0))


# SGLang's two lists, declared
SGLANG_LISTS = Lists("sglang-lists", victim=ListVictim.SHORT_POOL, shallow_first=True,
                     garbage=True, description="a full-KV LRU list and a mamba LRU list, "
                     "each evicting when its pool is short; stateless leaves collected")


class MambaRadixLRU(TwoListLRU):
    """SGLang's two LRU lists under one byte capacity (`SGLANG_LISTS`).

    SGLang evicts from the KV list when the KV pool is full and from the mamba list
    when the state pool is full. In a cache with a state-slot pool (SGLang's layout)
    that is the rule; under one byte budget states get `state_share` of the capacity.
    When states exceed their budget (counting the pending insert) the mamba list gives
    the victim, otherwise the KV list; either falls back to the other when it has nothing.
    - KV list: unpinned leaves, LRU; evicting one frees its KV and state.
    - mamba list: unpinned nodes holding a state, LRU, nearer the root first on ties;
      an inner node keeps its KV as a tombstone, a leaf leaves whole.
    - a leaf left without a state (a tombstone whose children all left) is garbage.
    A lookup refreshes the node it resumes from and its ancestors (SGLang's
    `reset_node_and_parents_mru`), not the KV matched beyond it; a commit refreshes the
    whole path. SGLang's cap on states per path runs on the Python core only.
    """

    LISTS = SGLANG_LISTS
    compiled_as = "radixlru"  # marconi.core.compiled runs it (no cap on states per path)

    def __init__(self, config: SGLangConfig | None = None) -> None:
        self.config = config or SGLangConfig()
        super().__init__(self.config.state_share)
        self.last_path: list[Node] = []  # the path the latest commit ran along

    def core_books(self) -> CoreBooks:
        """The compiled core's: the lists, the pools' split and the cap on states per
        path."""
        return replace(super().core_books(), cap_per_path=self.config.max_states_per_path)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        self.last_path = list(path)
        super().on_commit(self.last_path, new, now)

    def garbage(self, protected: Collection[Node]) -> Victim | None:
        return super().garbage(protected) or self._excess_state(protected)

    def _excess_state(self, protected: Collection[Node]) -> Victim | None:
        """The LRU inner state on the last committed path beyond the per-path cap."""
        cap = self.config.max_states_per_path
        held = [n for n in self.last_path if alive(n) and n.has_state]
        if cap is None or len(held) <= cap:
            return None
        inner = [n for n in held if n.children and not n.pins and n not in protected]
        if not inner:
            return None
        oldest = min(inner, key=lambda n: (self.state_stamp.get(n, 0), n.depth, n.id))
        return Victim(oldest, Action.DROP_STATE)


class MambaRadixFlop(MambaRadixLRU):
    """SGLang's two lists with Marconi's order for states (what
    marconi.engines.integrations.sglang puts into SGLang): the KV list stays LRU; the state list
    gives its victim in `FlopStates` order, the efficiency over the node's parent, states
    at branches (two or more children) after every other. Alpha 0 is `MambaRadixLRU`
    exactly."""

    compiled_as = "radixflop"  # marconi.core.compiled runs it (no cap on states per path)

    def __init__(self, config: SGLangConfig | None, spec: ModelSpec, alpha: float = 0.0,
                 *, score: Score) -> None:
        super().__init__(config)
        self.spec, self.alpha, self.score = spec, check_alpha(alpha), score
        self.flop = FlopStates(ListScore(score, spec, from_parent=True, branches_last=True))

    def core_books(self) -> CoreBooks:
        """The lists' books, and the states' declared score (Marconi's)."""
        return replace(super().core_books(), state_score=self.flop.declared)

    def set_alpha(self, alpha: float) -> None:
        self.alpha = check_alpha(alpha)

    def fresh(self, alpha: float) -> MambaRadixFlop:
        return MambaRadixFlop(self.config, self.spec, alpha, score=self.score)

    def _state_pick(self, lru: Node, protected: Collection[Node]) -> Node:
        return self.flop.pick(self.states, protected, self.alpha or 0.0) or lru
