"""vLLM v1's hybrid prefix caching as of 2026 (`mamba_cache_mode="align"`), as a peer.

vLLM caches whole blocks only. A Mamba state is cached where a block ends at the same
time as a scheduled step, so for a prompt of `n_input` tokens after a hit `h`:

```
| hit | chunk ........ | chunk .... | ... |  tail of prompt  | output ...... |
0     h   each chunk end (aligned)          a = n_input//B*B   every B in decode
              + j: the shared-prefix junction, KV matched rounded down to B
```
The KV past the last full block is not cached, and the last full block always holds a
state, so a commit keeps the sequence up to its last state. A hit needs a cached state
and all KV before it, and leaves one prompt token to compute (hit <= n_input - 1).
Eviction is LRU over freed blocks, a request's tail blocks first (`BlockLRU`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from marconi.core.books import CoreBooks
from marconi.core.layout import Layout
from marconi.core.policy import Admission, check_alpha
from marconi.core.priority import Lists, ListVictim, Score
from marconi.core.scores import ListScore
from marconi.core.spec import ModelSpec
from marconi.core.tree import Match, Node
from marconi.peers.mamba_radix import deepest_state
from marconi.peers.two_lists import FlopStates, TwoListLRU

ATTENTION_ALIGN = 16  # vLLM rounds the attention block size to a multiple of 16 tokens
# CacheConfig.DEFAULT_BLOCK_SIZE, where the derivation starts without --block-size: 16 in
# vLLM 0.32 and 0.33, 64 in 0.34 (FlashAttention takes it as its preferred block size)
BLOCK_BASES = (16, 64)


def vllm_block_tokens(spec: ModelSpec, base: int = ATTENTION_ALIGN) -> int:
    """The attention block size vLLM picks so that an attention page (one layer's KV
    of a block) holds at least one Mamba page (one layer's state), starting from the
    default block size `base` (`Platform._align_hybrid_block_size`): `K * ceil(mamba_page /
    (K * kv_bytes_per_token_per_layer))` with `K = max(16, base)`, rounded up to 16, and
    at least `base`. With base 16: `16 * ceil(mamba_page / (16 * ...))`."""
    per_token, kernel = spec.kv_layer_bytes_per_token, max(ATTENTION_ALIGN, base)
    needed = kernel * -(-spec.ssm_layer_bytes // (kernel * per_token))
    return max(base, ATTENTION_ALIGN * -(-needed // ATTENTION_ALIGN))


@dataclass(frozen=True, slots=True, kw_only=True)
class VLLMConfig:
    """Knobs of vLLM's align-mode Mamba prefix caching."""

    block: int | None = None  # tokens per block; None: derived from the model spec
    chunk: int = 8192  # max_num_batched_tokens: the longest prefill step
    # checkpoint at shared-prefix junctions (Marconi-style; vLLM PR 37898, docs/peers.md)
    junctions: bool = True
    # --prefix-cache-retention-interval (tokens, a multiple of the block): 0 keeps only the
    # states a later request can provably reuse (the replay boundary, junctions), R keeps
    # one more per R tokens, None every block's (dense)
    retention: int | None = 0
    # the default block size the derived one starts from (`block` None): 16 as vLLM 0.32
    # and 0.33, 64 as 0.34 (`BLOCK_BASES`, docs/peers.md)
    base: int = ATTENTION_ALIGN

    def __post_init__(self) -> None:
        if self.base not in BLOCK_BASES:
            raise ValueError(f"VLLMConfig.base must be one of {BLOCK_BASES} (vLLM's default "
                             f"block size), got {self.base!r}")
        for name in ("block", "chunk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"VLLMConfig.{name} must be a positive integer, got {value!r}")
        if self.chunk is None:
            raise ValueError("VLLMConfig.chunk must be a positive integer, got None")
        r = self.retention
        if r is not None and (not isinstance(r, int) or r < 0
                              or (r and self.block and r % self.block)):
            raise ValueError("VLLMConfig.retention must be None, 0 or a positive multiple of "
                             f"the block size, got {r!r}")


def vllm_layout(spec: ModelSpec, capacity: int, config: VLLMConfig | None = None) -> Layout:
    """vLLM's memory for a hybrid model: one pool of equal pages, KV in blocks of
    `config.block` tokens (default `vllm_block_tokens(spec, config.base)`); states count
    their padded size (`vllm_memory`)."""
    return Layout(page_size=_block(spec, config))


def _block(spec: ModelSpec, config: VLLMConfig | None) -> int:
    if config is None:
        return vllm_block_tokens(spec)
    return config.block or vllm_block_tokens(spec, config.base)


def vllm_group_size(spec: ModelSpec) -> int:
    """Layers per KV cache group: vLLM groups layers of each kind so that every group has
    as many layers (`_get_kv_cache_groups_uniform_page_size`): the fewer kind's count,
    or the larger one's when it is under 1.5 times the fewer."""
    counts = [n for n in (spec.attention_layers, spec.ssm_layers) if n]
    small, large = min(counts), max(counts)
    return large if large < 1.5 * small else small


def vllm_memory(spec: ModelSpec, capacity: int,
                config: VLLMConfig | None = None) -> tuple[ModelSpec, int]:
    """The spec and capacity vLLM's block pool amounts to. Each Mamba layer's state takes a
    whole attention page (`B x kv_layer_bytes_per_token`) and the SSM layers are padded to
    whole groups, so a state is `ceil(ssm / g)` blocks of `g` pages (the padding is carried
    as `checkpoint_extra_bytes`); the pool holds `capacity // block_bytes` blocks, of which
    block 0 is vLLM's null block and holds nothing."""
    if not spec.ssm_layers or not spec.attention_layers:
        return spec, capacity
    page = _block(spec, config) * spec.kv_layer_bytes_per_token
    group = vllm_group_size(spec)
    block_bytes = group * page
    state = -(-spec.ssm_layers // group) * block_bytes
    padded = spec.replace(checkpoint_extra_bytes=spec.checkpoint_extra_bytes + state
                          - spec.ssm_layers * spec.ssm_layer_bytes)
    if capacity >= 2**62:  # unbounded (the bounds' cache): nothing to round
        return padded, capacity
    return padded, max(0, (capacity // block_bytes - 1) * block_bytes)


class Align(Admission):
    """States at the replay boundary and shared-prefix junctions, and those the retention
    interval keeps (dense: every step end and block boundary of the output); full blocks
    only."""

    compiled_as = "align"  # marconi.core.compiled runs it (with a block queue)

    def __init__(self, config: VLLMConfig | None = None) -> None:
        self.config = config or VLLMConfig()

    @property
    def block(self) -> int:
        if self.config.block is None:
            raise ValueError("Align needs a block size: give one or call for_model(spec)")
        return self.config.block

    def for_model(self, spec: ModelSpec) -> Align:
        if self.config.block is not None:
            return self
        return Align(replace(self.config, block=vllm_block_tokens(spec, self.config.base)))

    def max_hit(self, n_input: int) -> int:
        return n_input - 1

    def kept(self, positions: Sequence[int], n_total: int) -> int:
        """Every full block of what was computed: a block's KV is cached (hashed) once
        full, whether or not a state ends on it; the last sampled token is never fed."""
        return (n_total - 1) // self.block * self.block

    def running(self, n_total: int) -> tuple[int, int]:
        """The running request holds the KV blocks of every token it computed (all but
        the last sampled one) and its working state's blocks."""
        return n_total - 1, 2

    def prefill(self, match: Match, n_input: int, hit: int) -> list[int]:
        """States saved while prefilling (hit, n_input] (may include `hit` itself): the
        replay boundary (the last block boundary before the prompt's last token) and the
        shared-prefix junction always; under dense retention every step's end too; under
        an interval R, every multiple of R."""
        b, r = self.block, self.config.retention
        out = [(n_input - 1) // b * b]
        if self.config.junctions:
            out.append(min(match.length, n_input - 1) // b * b)
        if r is None:
            step = max(b, self.config.chunk // b * b)  # steps are cut at block boundaries
            out += range(hit + step, n_input, step)
            out.append(n_input // b * b)
        elif r:
            out += range(r, n_input, r)
        return out

    def decode(self, n_input: int, n_total: int) -> range:
        """States saved while decoding: every block boundary (dense) or multiple of R
        crossed; vLLM never feeds the last sampled token, so it computes n_total - 1."""
        r = self.config.retention
        if r == 0:
            return range(0)
        step = self.block if r is None else r
        return range((n_input // step + 1) * step, n_total, step)

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        return tuple(sorted({p for p in self.prefill(match, n_input, hit) if p > hit}))

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        hit = deepest_state(match, self.max_hit(n_input))
        out = {p for p in self.prefill(match, n_input, hit) if p > hit}
        out.update(self.decode(n_input, n_total))
        replay = (n_input - 1) // self.block * self.block
        if replay > 0:
            out.add(replay)  # held already when it is the hit: the commit refreshes it
        return tuple(sorted(out))


# vLLM's free-block queue, declared
BLOCK_QUEUE = Lists("vllm-block-queue", victim=ListVictim.OLDER_HEAD, shallow_first=False,
                    garbage=False, description="one LRU over KV and state blocks, a "
                    "request's blocks freed tail first")


class BlockLRU(TwoListLRU):
    """vLLM's free-block queue: one LRU over KV blocks and state blocks alike
    (`BLOCK_QUEUE`).

    A request's blocks are freed together at its end, tail first, so at equal stamps
    the deeper entry leaves first. A lookup refreshes the KV up to the hit and the state
    it resumes from (the blocks the request takes); a commit refreshes the KV of the whole
    sequence and the states it adds. A state leaves alone (the KV block stays); a KV
    leaf leaves with its state. KV without a state after it stays until it is LRU.
    """

    LISTS = BLOCK_QUEUE
    compiled_as = "blocklru"  # marconi.core.compiled runs it


class BlockFlop(BlockLRU):
    """vLLM's free-block queue with Marconi's order for states (what
    marconi.engines.integrations.vllm puts into vLLM's block pool): whenever the queue's next
    victim is a state, the state that leaves is the first in `FlopStates` order, its
    efficiency over the nearest state above it (vLLM keeps no tree, so no branch rule).
    KV leaves as in `BlockLRU`; alpha 0 is `BlockLRU` exactly."""

    compiled_as = "blockflop"  # marconi.core.compiled runs it

    def __init__(self, spec: ModelSpec, alpha: float = 0.0, *, score: Score) -> None:
        super().__init__()
        self.spec, self.alpha, self.score = spec, check_alpha(alpha), score
        self.flop = FlopStates(ListScore(score, spec, from_parent=False, branches_last=False))

    def core_books(self) -> CoreBooks:
        """The lists' books, and the states' declared score (Marconi's): over the nearest
        state above, no tree."""
        return replace(super().core_books(), state_score=self.flop.declared)

    def set_alpha(self, alpha: float) -> None:
        self.alpha = check_alpha(alpha)

    def fresh(self, alpha: float) -> BlockFlop:
        return BlockFlop(self.spec, alpha, score=self.score)

    def _state_pick(self, lru: Node, protected: Collection[Node]) -> Node:
        return self.flop.pick(self.states, protected, self.alpha or 0.0) or lru
