"""Marconi's FLOP-aware eviction inside vLLM 0.32's block pool (docs/integrations.md).

In a deployment whose vLLM environment has marconi installed, one variable turns it on:

    MARCONI_VLLM=marconi MARCONI_MODEL=paper-7b vllm serve ...

vLLM loads every general plugin (entry-point group `vllm.general_plugins`) in each of its
processes, the engine core's included, before it builds the KV cache manager; marconi's
(`plugin`) does nothing unless `MARCONI_VLLM` is set. When it is, `install` puts in:

- **KV no hit can use, first**: vLLM caches every full block a request computed, also
  the blocks past the last state cached on its sequence (its output, mostly), though a
  hit must end at a state: once the request is gone they save no FLOPs, and Marconi's
  tree would not hold them. `KVCacheManager.free` is wrapped to note them (the deepest
  state on the request's sequence is found through vLLM's own hash map), and the pool
  takes them before anything else vLLM would evict (`MARCONI_ORPHANS=keep` leaves them in
  vLLM's order).
- **which Mamba states leave**: `kv_cache_coordinator.BlockPool`, the class every KV cache
  coordinator builds its pool from, becomes `MarconiBlockPool`, a subclass of vLLM's own
  `BlockPool`. vLLM takes new blocks from the head of its free queue (LRU, a finished
  request's tail first), evicting the hash of each cached block it takes. The subclass
  takes as many, and the same KV blocks (orphans aside); only when a block it takes is a
  cached Mamba state does it take, in its place, the free cached state that comes first
  in Marconi's order: one whose KV or other groups' blocks are gone (no hit can use it),
  else the lowest `recency + alpha x efficiency`, both min-max normalized over the
  group's free states, recency the state's rank in the free queue, `efficiency = (F(d) -
  F(p)) / (KV bytes of p..d + state bytes)` for a state after `d` tokens whose nearest
  cached state above was after `p` tokens when it was cached (F the model's prefill
  FLOPs). A state spans one block per Mamba group and serves a hit only whole, so the
  victim is chosen once per state and every group's block of it goes. At alpha 0 the
  states leave in vLLM's order. The blocks are put at the head of the queue and taken by
  vLLM's own `get_new_blocks`.
- **the bootstrap tuner beside the engine**: `KVCacheManager.free` hands a finished
  request's tokens to `Tuning`, which runs a marconi mirror of the cache (system
  `vllm-2026+marconi`: vLLM's admission and block queue as emulated, Marconi's order for
  the states it evicts, the engine's pool; orphan KV is not modelled) and marconi's
  `BootstrapTuner` in a background thread. The alpha it adopts is the engine's from its
  next eviction. `MARCONI_ALPHA` fixes alpha instead (no tuner).
- **or marconi+** (`=marconi+` instead of `=marconi`): marconi+'s shadow experts
  choose the alpha instead, from mirrors at the engine's own order and Marconi's score
  at fixed alphas, never stopping (`integrations.common.Shadows`).

Requirements, each checked with a one-line error: vLLM 0.32.x, 0.33.x or 0.34.x; a model
with Mamba layers (checked when the cache is built).
"""

from __future__ import annotations

import logging
import os
import time
from operator import attrgetter
from typing import Any

import numpy as np

from marconi.core.scores import FlopsAt, flop_order, flop_score
from marconi.core.spec import ModelSpec
from marconi.integrations.common import (
    Counters,
    Installed,
    Integration,
    IntegrationError,
    Tuning,
    asked,
    check_policy,
    one_line_exit,
)

# any 0.32.x, 0.33.x or 0.34.x: the series whose cache classes the tests run it through
# (0.33 and 0.34 from their GPU wheels, docs/integrations.md, "vLLM 0.33", "vLLM 0.34")
SUPPORTED_VERSIONS = ("0.32", "0.33", "0.34")
WHO = "marconi.integrations.vllm"
ENABLE = "MARCONI_VLLM"  # "marconi": install at plugin load
ORPHANS = "MARCONI_ORPHANS"  # "keep": orphan KV left in vLLM's order (default "first")
TUNER = "MARCONI_TUNER"  # where the tuner runs: "process" (the default) or "thread"
CPU_SPLIT = "MARCONI_VLLM_CPU_SPLIT"  # "1": no mid-prefill Mamba checkpoint (CPU only)
REPORT_EVERY = 100  # finished requests between the plugin's cost lines
# vLLM's own logger tree, so that the plugin's lines carry each process's prefix
log = logging.getLogger("vllm.marconi")
MIRROR = "vllm-2026+marconi"  # the tuner's mirror: vLLM's admission, Marconi's order


# Where vLLM keeps a cached block's hash and the tokens it covers: up to 0.33 in the slots
# behind the properties `block_hash` / `block_hash_num_tokens` (read directly: a call less
# each, in the hooks' loops), from 0.34 in plain fields of those names. `install` sets
# both for the vLLM it finds (`block_fields`); the hooks read them at each call.
_hash_of: Any = attrgetter("_block_hash")
_depth_of: Any = attrgetter("_block_hash_num_tokens")


def block_fields(version: str) -> tuple[str, str]:
    """The names of `KVCacheBlock`'s hash and depth slots in vLLM `version`."""
    if _series(version) >= (0, 34):
        return "block_hash", "block_hash_num_tokens"
    return "_block_hash", "_block_hash_num_tokens"


def _series(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def pool_self(pool: Any) -> Any:
    """What a block of `pool` holds as its `pool`: the pool itself up to 0.33, a weak
    reference to it from 0.34 (`BlockPool._weak_self`, set in its `__init__`)."""
    return pool.__dict__.get("_weak_self", pool)


def check_version() -> str:
    """The installed vLLM's version (its own `__version__`: the GPU and CPU builds ship
    under different distribution names), or IntegrationError naming the supported one."""
    *first, last = (f"{v}.x" for v in SUPPORTED_VERSIONS)
    supported = f"{', '.join(first)} and {last}" if first else last
    try:
        import vllm
    except ImportError:
        raise IntegrationError(f"{WHO}: vllm is not installed (it supports vllm "
                               f"{supported})") from None
    version = str(vllm.__version__)
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VERSIONS):
        raise IntegrationError(f"{WHO} supports vllm {supported} only; this environment "
                               f"has {version}")
    return version


# --- the order -------------------------------------------------------------------------


class StateOrder:
    """Marconi's score over the free cached states of a Mamba group, and what it needs to
    know of each state (its efficiency, whether a hit can still use it), kept up to date by
    the pool's hooks so that a choice reads them for the candidates that one walk of vLLM's
    free queue finds (`MarconiBlockPool._free_states`); `alpha` may change at any time
    (the tuner sets it; a float assignment is atomic). A state is a block hash (group id
    left out) with one block per Mamba group. `first` is the same choice made the plain way, over a
    list: the reference that `check` compares every choice with."""

    def __init__(self, spec: ModelSpec, alpha: float = 0.0, orphans_first: bool = True
                 ) -> None:
        self.spec, self.alpha = spec, float(alpha)
        self.orphans_first = orphans_first  # False: orphan KV left in vLLM's order
        self.check = False  # True: every choice also made by `first`, and compared
        # block id -> (depth, state above, efficiency): all three fixed when it is cached
        self.above: dict[int, tuple[int, int, float]] = {}
        self.eff_of = np.zeros(0)  # block id -> its state's efficiency (set by `note`)
        self.state_of: dict[int, bytes] = {}  # block id -> its state
        self.blocks_of: dict[bytes, set[int]] = {}  # state -> its cached blocks
        # state -> the hash keys a hit on it needs: the deepest attention block at or
        # before its depth (one per attention group) and its block in every Mamba group
        self.keys_of: dict[bytes, tuple[Any, ...]] = {}
        self.needed_by: dict[Any, set[bytes]] = {}  # hash key -> states needing it
        self.dead: set[bytes] = set()  # states one of whose keys is not cached
        self._f = FlopsAt(spec)
        self._kv, self._ssm = spec.kv_bytes_per_token, spec.ssm_bytes

    def size(self, num_blocks: int) -> None:
        self.eff_of = np.zeros(num_blocks)

    def above_of(self, depth: int, top: int) -> tuple[int, int, float]:
        """What `note` keeps of a state cached after `depth` tokens whose nearest cached
        state above was after `top`: both, and its efficiency."""
        return depth, top, self._efficiency(depth, top)

    def note(self, block_id: int, state: bytes, above: tuple[int, int, float]) -> None:
        """Block `block_id` of `state` (`above`: `above_of` its depth and top; a state's
        blocks in the other groups share the tuple)."""
        if self.state_of.get(block_id) not in (None, state):
            self.forget(block_id)
        self.above[block_id] = above
        self.eff_of[block_id] = above[2]
        self.state_of[block_id] = state
        blocks = self.blocks_of.get(state)
        if blocks is None:
            self.blocks_of[state] = {block_id}
        else:
            blocks.add(block_id)

    def depend(self, state: bytes, keys: tuple[Any, ...], cached: Any) -> None:
        """`state` needs `keys` cached for a hit (`cached(key)`: is it now)."""
        self.keys_of[state] = keys
        for key in keys:
            self.needed_by.setdefault(key, set()).add(state)
        if not all(map(cached, keys)):
            self.dead.add(state)

    def forget(self, block_id: int) -> None:
        """A state block's hash is gone; its state's books go with its last block."""
        self.above.pop(block_id, None)
        state = self.state_of.pop(block_id, None)
        if state is None:
            return
        blocks = self.blocks_of.get(state, set())
        blocks.discard(block_id)
        if blocks:
            return
        self.blocks_of.pop(state, None)
        for key in self.keys_of.pop(state, ()):
            users = self.needed_by.get(key)
            if users is not None:
                users.discard(state)
                if not users:
                    del self.needed_by[key]
        self.dead.discard(state)

    def removed(self, key: Any) -> None:
        """`key` is cached no more: the states needing it can serve no hit."""
        users = self.needed_by.get(key)
        if users:
            self.dead.update(users)

    def inserted(self, key: Any, cached: Any) -> None:
        """`key` is cached again: a state needing it lives if all its keys are (looked up
        last first: a state being cached comes up group by group, so that its last Mamba
        group's key is the one still missing but at its last group)."""
        for state in self.needed_by.get(key, ()):
            if state in self.dead and all(map(cached, reversed(self.keys_of[state]))):
                self.dead.discard(state)

    def pick(self, found: dict[int, Any], skip: set[int]) -> Any:
        """The state block to evict among the free ones `found` (free queue order) less
        `skip`: the first whose KV or other blocks are gone, else the first in Marconi's
        order (min-max normalized over exactly these candidates)."""
        ids = [i for i in found if i not in skip] if skip else list(found)
        if self.alpha == 0.0 or len(ids) < 2:
            return found[ids[0]]
        dead = self.dead
        if dead:  # (a block's state is `state_of`'s, the same books as `blocks_of`)
            state_of = self.state_of
            for i in ids:
                if state_of.get(i) in dead:
                    return found[i]
        if len(ids) <= FEW:  # numpy's calls cost more than the score in Python
            item = self.eff_of.item
            return found[ids[first_lowest([item(i) for i in ids], self.alpha)]]
        at = np.array(ids, dtype=np.int64)
        return found[ids[int(np.argmin(flop_score(self.eff_of[at], self.alpha)))]]

    def efficiency(self, block: Any) -> float:
        depth = int(block.block_hash_num_tokens)
        known = self.above.get(block.block_id)
        if known is not None and known[0] == depth:
            return known[2]
        return self._efficiency(depth, 0)

    def _efficiency(self, depth: int, top: int) -> float:
        held = self._kv * (depth - top) + self._ssm
        return (self._f(depth) - self._f(top)) / held

    def first(self, candidates: list[Any], cached: Any) -> int:
        """The index, in `candidates` (free queue order), of the state to evict: the
        first whose KV or other blocks are gone (`cached(key)` false for a key of its
        state's `keys_of`: no hit can use it, and a tree would have dropped it with its
        KV), else the first in Marconi's order."""
        if self.alpha == 0.0 or len(candidates) < 2:
            return 0
        for i, block in enumerate(candidates):
            state = self.state_of.get(block.block_id)
            if not all(cached(key) for key in self.keys_of.get(state, ())):  # type: ignore
                return i
        eff = np.array([self.efficiency(b) for b in candidates])
        return int(flop_order(eff, self.alpha)[0])


FEW = 48  # candidates up to which `StateOrder.pick` scores them in Python


def flop_scores(effs: list[float], alpha: float) -> list[float]:
    """`flop_score(np.array(effs), alpha).tolist()`, bit for bit, in Python (at least two
    candidates): the same IEEE operations on the same doubles in the same order (rank
    k / (n - 1); efficiency min-max normalized, all equal -> 1; rank plus alpha times
    that), without numpy's cost per call, some ten of them, on a few candidates."""
    low, high, last = min(effs), max(effs), len(effs) - 1
    if high == low:
        return [k / last + alpha * 1.0 for k in range(last + 1)]
    span = high - low
    return [k / last + alpha * ((e - low) / span) for k, e in enumerate(effs)]


def first_lowest(effs: list[float], alpha: float) -> int:
    """`int(np.argmin(flop_score(np.array(effs), alpha)))`: the first lowest score."""
    scores = flop_scores(effs, alpha)
    return scores.index(min(scores))


# --- installing it ----------------------------------------------------------------------


_installed = Installed()


def install(spec: ModelSpec, *, policy: str = "marconi", alpha: float | None = None,
            background: bool = True, orphans_first: bool = True, process: bool = False
            ) -> Integration:
    """Put Marconi's eviction into vLLM (before its KV cache manager is built); `alpha`
    fixes it, else the bootstrap tuner sets it (`background`: in its own thread, or with
    `process` in a child process). `orphans_first=False` leaves cached KV past a
    request's last state in vLLM's order (an ablation: with alpha 0 the engine is then
    stock vLLM)."""
    global _hash_of, _depth_of
    check_policy(WHO, policy)
    version = check_version()
    from vllm.v1.core import kv_cache_coordinator as kcc
    from vllm.v1.core import kv_cache_manager as kcm

    uninstall()
    hash_field, depth_field = block_fields(version)
    _hash_of, _depth_of = attrgetter(hash_field), attrgetter(depth_field)
    order = StateOrder(spec, alpha or 0.0, orphans_first)
    done = Integration.of(policy, order, spec, alpha, background, process, log)
    stock_pool, stock_init = kcc.BlockPool, kcc.KVCacheCoordinator.__init__
    free = kcm.KVCacheManager.free
    kcc.BlockPool = _pool_class(stock_pool, done)
    kcc.KVCacheCoordinator.__init__ = _coordinator_init(stock_init, order)
    kcm.KVCacheManager.free = _free(free, done)
    done.undo = [(kcc, "BlockPool", stock_pool),
                 (kcc.KVCacheCoordinator, "__init__", stock_init),
                 (kcm.KVCacheManager, "free", free)]
    return _installed.put(done)


def uninstall() -> None:
    """Put vLLM's own classes back (tests, benchmarks running both)."""
    _installed.uninstall()


def plugin() -> None:
    """vLLM's general-plugin entry point: install when `MARCONI_VLLM` asks, and switch the
    CPU build's mid-prefill Mamba checkpoint off when `MARCONI_VLLM_CPU_SPLIT=1` asks
    (either without the other). A bad setting stops the process with one line. vLLM loads
    plugins in several processes and may call this more than once in one; a second call
    in a process changes nothing."""
    if _installed.current is not None:
        return
    with one_line_exit():
        split = os.environ.get(CPU_SPLIT, "")
        if split not in ("", "0", "1"):
            raise IntegrationError(f"{WHO}: {CPU_SPLIT}={split!r} is not 0 or 1")
        if split == "1":
            split_prefills_on_cpu()
        wanted = asked(WHO, ENABLE)
        if wanted is None:
            return
        orphans = os.environ.get(ORPHANS, "first")
        if orphans not in ("first", "keep"):
            raise IntegrationError(f"{WHO}: {ORPHANS}={orphans!r} is not first or keep")
        where = os.environ.get(TUNER, "process")
        if where not in ("process", "thread"):
            raise IntegrationError(f"{WHO}: {TUNER}={where!r} is not process or thread")
        install(wanted.spec, policy=wanted.policy, alpha=wanted.alpha,
                orphans_first=orphans == "first", process=where == "process")
        tuned = (f"fixed at {wanted.alpha:g}" if wanted.alpha is not None else
                 "chosen by marconi+'s shadow experts" if wanted.policy == "marconi+" else
                 "bootstrap-tuned")
        log.info("marconi: on in this process (pid %d): policy %s, model %s, alpha %s%s, "
                 "orphan KV %s", os.getpid(), wanted.policy, wanted.spec.name, tuned,
                 "" if wanted.alpha is not None else f" (tuner in a {where})",
                 "first" if orphans == "first" else "in vLLM's order")


_split_done = False


def split_prefills_on_cpu() -> None:
    """vLLM 0.32's Mamba2 layers ask for a mid-prefill state checkpoint that the CPU
    build's scan does not return (`conv_ssm_forward`: IndexError, then the engine dies on
    the first prompt longer than one block). On the CPU platform, declare the
    layers' state specs without it, as every other Mamba layer does: the scheduler then
    splits prefills at block boundaries instead, and the same states are cached. Other
    platforms are left alone (logged)."""
    global _split_done
    if _split_done:
        return
    check_version()
    from vllm.platforms import current_platform

    _split_done = True
    if not current_platform.is_cpu():
        log.info("marconi: %s=1 ignored: this is not vLLM's CPU platform", CPU_SPLIT)
        return
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    # MambaBase's spec: no checkpoint block, as the other Mamba layers declare it
    MambaMixer2.get_kv_cache_spec = MambaBase.get_kv_cache_spec
    log.info("marconi: vLLM's mid-prefill Mamba checkpoint is off (%s=1; its CPU scan cannot "
             "return it): prefills split at block boundaries", CPU_SPLIT)


_now = time.perf_counter_ns


class _Clocks:
    """What a hook calls with the time it took (ns, read with `_now` before the call): the
    loop's ordering cost, and one of its parts: books (the pool's hooks keeping the
    states' books), record (a state cached), choose (an allocation's blocks, the walk for a
    victim's candidates included), past (a finished
    request's KV past its last state). The clock is read first, so that the figure holds
    the hook's work and not the counting (a call into code that is cold in the
    scheduling loop: a microsecond or two, as much as some hooks' work); one function per
    part, as finding the counter by name cost more again."""

    def __init__(self, counters: Counters) -> None:
        def books(spent: int) -> None:
            counters.order_ns += spent
            counters.books_ns += spent

        def record(spent: int) -> None:
            counters.order_ns += spent
            counters.record_ns += spent

        def choose(spent: int) -> None:
            counters.order_ns += spent
            counters.choose_ns += spent

        def past(spent: int) -> None:
            counters.order_ns += spent
            counters.past_ns += spent

        self.books, self.record, self.choose, self.past = books, record, choose, past


def booked(order: StateOrder, block: Any, key: Any, last: tuple[Any, Any]) -> bool:
    """Whether the pool's `_record` of `block` (cached again; `key`, its hash, not None)
    would change nothing, so the hooks skip it: the state last recorded (`last`, the
    pool's `marconi_last`: that state and its above-tuple) is the block's, at the block's
    depth, and the books hold the block with that state and that very above-tuple, and the
    state's keys. The same test `_record` makes, made before the call."""
    return (last[0] == key[:-4] and last[1][0] == _depth_of(block)
            and order.above.get(block.block_id) is last[1]
            and order.state_of.get(block.block_id) == last[0]
            and last[0] in order.keys_of)


def _suffix(group: int) -> bytes:
    """What vLLM's `make_block_hash_with_group_id` appends to a block hash for `group`: a
    hook joins the two bytes itself, a function call saved per key."""
    return group.to_bytes(4, "big")


def _coordinator_init(stock: Any, order: StateOrder) -> Any:
    """`KVCacheCoordinator.__init__`, then the pool told which groups hold Mamba states."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    def __init__(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        stock(self, kv_cache_config, *args, **kwargs)
        pool = self.block_pool
        if hasattr(pool, "marconi_states"):
            groups = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                      if isinstance(g.kv_cache_spec, MambaSpec)]
            if not groups:
                raise IntegrationError(f"{WHO}: this model has no Mamba layers; Marconi's "
                                       "eviction orders Mamba states only")
            pool.marconi_states = dict.fromkeys(groups)
            pool.marconi_state_ends = {_suffix(g): g for g in groups}
            pool.marconi_state_suffixes = [_suffix(g) for g in groups]
            if len(kv_cache_config.kv_cache_groups) <= 256:  # a key's last byte: its group
                pool.marconi_state_of_byte = tuple(
                    i if i in groups else None for i in range(256))
            order.size(len(pool.blocks))
            pool.marconi_replacing = {}
            pool.marconi_orphans = {}
            pool.marconi_orphans_first = order.orphans_first
            pool.marconi_config = kv_cache_config
            pool.marconi_kv_groups = [
                (i, g.kv_cache_spec.block_size, _suffix(i))
                for i, g in enumerate(kv_cache_config.kv_cache_groups)
                if isinstance(g.kv_cache_spec, AttentionSpec)]
            # each attention group's request -> blocks (its manager's own dict: a
            # finished request's blocks read without `get_blocks`' tuple over every group)
            pool.marconi_kv_blocks = [(self.single_type_managers[i].req_to_blocks, size)
                                      for i, size, _ in pool.marconi_kv_groups]

    return __init__


def _pool_class(stock: type, integration: Integration) -> type:
    """vLLM's `BlockPool` with Marconi's choice of the Mamba states that leave. Every hook
    times what it adds (`_Clocks`), vLLM's own work left out."""
    from vllm.v1.core.kv_cache_utils import resolve_block_hashes

    assert isinstance(integration.order, StateOrder)
    order: StateOrder = integration.order
    counters = integration.counters
    clocks = _Clocks(counters)

    class MarconiBlockPool(stock):
        """vLLM's `BlockPool`; when a block it takes is a cached Mamba state, Marconi's
        order says which state goes (marconi.integrations.vllm)."""

        # the Mamba groups (a dict, for `in`); set by the coordinator's hook
        marconi_states: dict[int, None] | None = None
        # a state group's hash suffix -> the group; the suffixes, in group order
        marconi_state_ends: dict[bytes, int] = {}  # noqa: RUF012
        marconi_state_suffixes: list[bytes] = []  # noqa: RUF012
        # a key's last byte -> its Mamba group, or None (not a Mamba group's key): where
        # every group id is below 256 its 4-byte suffix is three zeros and that byte
        marconi_state_of_byte: tuple[int | None, ...] | None = None
        marconi_config: Any = None
        # (group, block size, hash suffix) of each attention group
        marconi_kv_groups: list[tuple[int, int, bytes]] = []  # noqa: RUF012
        # (request id -> blocks, block size) of each attention group
        marconi_kv_blocks: list[tuple[dict[str, list[Any]], int]] = []  # noqa: RUF012
        marconi_replacing: dict[bytes, bytes] = {}  # noqa: RUF012  state -> its victim
        # free cached KV blocks past the last state of the request that freed them: no
        # hit ends past a state, so they save no FLOPs (a tree would not keep them)
        marconi_orphans: dict[int, Any] = {}  # noqa: RUF012
        marconi_orphans_first = True  # False: left in vLLM's order (an ablation)
        # the last state recorded and what `note` kept of it (`StateOrder.above_of`): its
        # blocks in the other groups come next and share it
        marconi_last: tuple[bytes | None, tuple[int, int, float]] = (None, (0, 0, 0.0))

        def cache_full_blocks(self, request: Any, blocks: list[Any], num_cached_blocks: int,
                              num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                              block_mask: list[bool] | None = None) -> None:
            super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                      block_size, kv_cache_group_id, block_mask)
            states = self.marconi_states
            if states is not None and kv_cache_group_id in states \
                    and num_full_blocks > num_cached_blocks:
                start = _now()
                for i in range(num_cached_blocks, num_full_blocks):
                    block = blocks[i]  # (align mode: a state per scheduled step only)
                    key = _hash_of(block)
                    if key is None:  # null or masked: no state (`_record` would return)
                        continue
                    # `_record`, unless the block is in the books as it would leave them
                    if not booked(order, block, key, self.marconi_last):
                        self._record(request, block, kv_cache_group_id)
                clocks.record(_now() - start)

        def cache_partial_block(self, request: Any, block: Any, num_tokens: int,
                                kv_cache_group_id: int, block_size: int,
                                replace_existing_hashes: bool = False) -> Any:
            out = super().cache_partial_block(request, block, num_tokens, kv_cache_group_id,
                                              block_size, replace_existing_hashes)
            states = self.marconi_states
            if out is not None and states is not None and kv_cache_group_id in states:
                start, key, last = _now(), _hash_of(block), self.marconi_last
                # most calls cache a block again as it is in the books (a step's partial
                # entry after its full block): `_record` would change nothing, and is not
                # called (the same test as its own, which `_record` then makes again)
                if key is not None and not booked(order, block, key, last):
                    self._record(request, block, kv_cache_group_id)
                clocks.record(_now() - start)
            return out

        def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
            start = _now()
            above = order.above.get(src_block.block_id)
            state = order.state_of.get(src_block.block_id)
            keys = order.keys_of.get(state) if state is not None else None
            clocks.books(_now() - start)
            super().move_block_hashes(src_block, dst_block)  # forgets src (below)
            if above is not None and state is not None:
                start = _now()
                order.note(dst_block.block_id, state, above)
                if keys is not None and state not in order.keys_of:
                    order.depend(state, keys, self._is_cached())
                clocks.books(_now() - start)

        def _remove_cached_block_hashes(self, block: Any) -> list[Any]:
            removed: list[Any] = super()._remove_cached_block_hashes(block)
            if removed and self.marconi_states is not None:  # taken, its hash replaced or dropped
                start, block_id = _now(), block.block_id
                if self.marconi_orphans:
                    self.marconi_orphans.pop(block_id, None)
                if block_id in order.state_of:
                    order.forget(block_id)
                needed, cached = order.needed_by, self.cached_block_hash_to_block._cache
                for key in removed:
                    if key in needed and key not in cached:
                        order.removed(key)
                clocks.books(_now() - start)
            return removed

        def _insert_block_hash(self, block_hash_with_group_id: Any, block: Any,
                               num_tokens: int | None) -> None:
            super()._insert_block_hash(block_hash_with_group_id, block, num_tokens)
            users = order.needed_by.get(block_hash_with_group_id)
            if users and not order.dead.isdisjoint(users):  # else it changes nothing
                start = _now()
                order.inserted(block_hash_with_group_id, self._is_cached())
                clocks.books(_now() - start)

        def reset_prefix_cache(self) -> bool:
            done: bool = super().reset_prefix_cache()
            if done and self.marconi_states is not None:
                self.marconi_orphans.clear()
                self.marconi_replacing.clear()
                for book in (order.above, order.state_of, order.blocks_of, order.keys_of,
                             order.needed_by):
                    book.clear()
                order.dead.clear()
            return done

        def touch(self, blocks: Any) -> None:
            orphans = self.marconi_orphans
            if orphans:
                start = _now()
                for block in blocks:
                    if block.ref_cnt == 0:
                        orphans.pop(block.block_id, None)
                clocks.books(_now() - start)
            super().touch(blocks)

        def get_new_blocks(self, num_blocks: int) -> list[Any]:
            chosen = self._marconi_choice(num_blocks)
            if chosen is None:
                return super().get_new_blocks(num_blocks)
            start, queue = _now(), self.free_block_queue
            for block in chosen:  # to the head of the queue, where vLLM takes from
                queue.remove(block)
            queue.prepend_n(chosen)
            clocks.choose(_now() - start)
            taken: list[Any] = super().get_new_blocks(num_blocks)
            start = _now()
            if [b.block_id for b in taken] != [b.block_id for b in chosen]:
                raise IntegrationError(f"{WHO}: vLLM took other blocks than the ones put at "
                                       "the head of its free queue")
            clocks.choose(_now() - start)
            return taken  # each cached one left the books as its hash went (above)

        def _record(self, request: Any, block: Any, group: int) -> None:
            """Block `block`'s state in the books: its depth, and that of the nearest
            cached state above it (same group) on the request's prefix, found through
            vLLM's own hash map (by the state's first block to come up: the others share
            it); on its first block, what a hit on it needs."""
            key = _hash_of(block)  # (up to 0.33 the slot behind `block_hash`: a call less)
            if key is None or block.is_null:
                return
            depth, state = int(_depth_of(block)), key[:-4]  # get_block_hash
            last_state, above = self.marconi_last
            if last_state != state:
                above = order.above_of(depth, self._top(request.block_hashes, depth, group))
                self.marconi_last = (state, above)
            elif above[0] != depth:  # (one hash, one depth: never, but exact if it were)
                above = order.above_of(depth, above[1])
            # most calls cache a block again as it was (a step's partial entry, then the
            # full block): nothing to note then (its tuple is mostly the one shared)
            block_id = block.block_id
            known = order.above.get(block_id)
            if (known is not above and known != above) \
                    or order.state_of.get(block_id) != state:
                order.note(block_id, state, above)
            if state not in order.keys_of:  # its first block: what a hit on it needs
                order.depend(state, self._keys(request.block_hashes, state, depth),
                             self._is_cached())

        def _top(self, hashes: Any, depth: int, group: int) -> int:
            """The depth of the nearest state cached above `depth` on `hashes` (0: none)."""
            size, suffix = self.hash_block_size, _suffix(group)
            cache = self.cached_block_hash_to_block._cache  # (see `_is_cached`)
            for j in range(min(depth // size, len(hashes)) - 2, -1, -1):
                if hashes[j] + suffix in cache:
                    return (j + 1) * size
            return 0

        def _keys(self, hashes: Any, state: bytes, depth: int) -> tuple[Any, ...]:
            """The hash keys a hit on `state` (after `depth` tokens) needs: the deepest
            block at or before it in each attention group, its block in each Mamba one."""
            keys = []
            for _, kv_block, suffix in self.marconi_kv_groups:
                if depth // kv_block:
                    full = resolve_block_hashes(hashes, self.hash_block_size, kv_block)
                    keys.append(full[depth // kv_block - 1] + suffix)
            return (*keys, *(state + suffix for suffix in self.marconi_state_suffixes))

        def _cached(self, key: Any) -> bool:
            """Is `key` cached, as vLLM's map says (the plain check's)."""
            return self.cached_block_hash_to_block.get_one_block(key) is not None

        def _is_cached(self) -> Any:
            """`_cached` in C, for the hooks: the map's own dict's `__contains__` (vLLM's
            map drops a key with its last block, `BlockHashToBlockMap.pop`: a key it holds
            has a block), looked up at each call (`reset_prefix_cache` makes a new map)."""
            return self.cached_block_hash_to_block._cache.__contains__

        def _check(self, chosen: Any, group: int, skip: set[int], found: dict[int, Any]
                   ) -> None:
            """The same choice made the plain way (`StateOrder.first` over the free states
            as vLLM's queue and the blocks say), and what the quick one read: the
            candidates (`found`, `_free_states`) and the books."""
            ends, me = self.marconi_state_ends, pool_self(self)
            live = [b for b in self.free_block_queue.get_all_free_blocks()
                    if b.block_hash is not None and ends.get(b.block_hash[-4:]) == group
                    and b.ref_cnt == 0 and not b.is_null and b.pool is me]
            if [b.block_id for b in live] != list(found) or \
                    any(found[b.block_id] is not b for b in live):
                raise IntegrationError(f"{WHO}: the free states of group {group} are not "
                                       f"what the blocks say: {list(found)} found, "
                                       f"{[b.block_id for b in live]} in vLLM's queue")
            for block in live:
                state = order.state_of.get(block.block_id)
                dead = not all(self._cached(k) for k in order.keys_of.get(state, ()))  # type: ignore
                if dead != (state in order.dead) or \
                        order.eff_of[block.block_id] != order.efficiency(block):
                    raise IntegrationError(f"{WHO}: the books of state block "
                                           f"{block.block_id} are stale")
            free = [b for b in live if b.block_id not in skip]
            plain = free[order.first(free, self._cached)]
            if plain.block_id != chosen.block_id:
                raise IntegrationError(f"{WHO}: the victim chosen is block {chosen.block_id}, "
                                       f"the plain order's is {plain.block_id}")
            counters.checked += 1

        def _marconi_choice(self, num_blocks: int) -> list[Any] | None:
            """The blocks to take, in Marconi's order; None: vLLM's own (alpha 0, nothing
            cached among them, or a request vLLM refuses). Free uncached blocks first, as
            vLLM takes them; then cached KV no hit can reach (`marconi_orphans`); then
            vLLM's queue, each state in it standing for the state Marconi's order
            evicts."""
            states, alpha = self.marconi_states, order.alpha  # (the tuner may change it)
            if states is None or not self.enable_caching:
                return None
            if num_blocks > self.get_num_free_blocks() \
                    or (alpha == 0.0 and not (self.marconi_orphans_first
                                              and self.marconi_orphans)):
                return None
            start = _now()
            head: list[Any] = []
            block = self.free_block_queue.fake_free_list_head.next_free_block
            while len(head) < num_blocks and block.block_hash is None:
                head.append(block)
                block = block.next_free_block
            if len(head) == num_blocks:  # uncached blocks only: vLLM's own choice
                clocks.choose(_now() - start)
                return None
            orphans, took_orphans = self.marconi_orphans, False
            while orphans and len(head) < num_blocks:
                orphan = orphans.pop(next(iter(orphans)))
                if orphan.ref_cnt == 0 and orphan.block_hash is not None:
                    head.append(orphan)
                    counters.orphans += 1
                    took_orphans = True
            chosen_ids = {b.block_id for b in head}
            while len(head) < num_blocks:
                if block.block_id not in chosen_ids:
                    head.append(block)
                block = block.next_free_block
            # at alpha 0 states go in vLLM's order
            slots = [] if alpha == 0.0 else self._state_slots(head)
            if not slots and not took_orphans:  # the queue's head, in its order: vLLM's own
                clocks.choose(_now() - start)
                return None
            chosen, taken = list(head), {b.block_id for b in head}
            found: list[dict[int, dict[int, Any]]] = []  # `_free_states`, walked once if asked
            for i, group in slots:
                pick = self._victim(head[i], group, taken, found)
                taken.add(pick.block_id)
                chosen[i] = pick
                counters.victims += 1
            counters.walks += 1
            clocks.choose(_now() - start)
            return chosen

        def _free_states(self) -> dict[int, dict[int, Any]]:
            """Each Mamba group's free cached states (block id -> block), in vLLM's free
            queue order: one walk of the queue, when a choice needs them (some times in a
            hundred requests, where books kept beside the queue cost its hooks some
            thirty calls a request)."""
            states, ends = self.marconi_states, self.marconi_state_ends
            assert states is not None
            found: dict[int, dict[int, Any]] = {g: {} for g in states}
            of_byte, me, hash_of = self.marconi_state_of_byte, pool_self(self), _hash_of
            block = self.free_block_queue.fake_free_list_head.next_free_block
            while block.next_free_block is not None:  # (the fake tail has none)
                key = hash_of(block)
                if key is not None:
                    group = of_byte[key[-1]] if of_byte is not None else ends.get(key[-4:])
                    if group is not None and block.ref_cnt == 0 and not block.is_null \
                            and block.pool is me:
                        found[group][block.block_id] = block
                block = block.next_free_block
            return found

        def _state_slots(self, head: list[Any]) -> list[tuple[int, int]]:
            """(index, group) of each free cached state among `head` (free blocks)."""
            slots, ends, of_byte = [], self.marconi_state_ends, self.marconi_state_of_byte
            me, hash_of = pool_self(self), _hash_of
            for i, block in enumerate(head):
                key = hash_of(block)
                if key is not None:  # (a key's group as `_free_states` reads it)
                    group = of_byte[key[-1]] if of_byte is not None else ends.get(key[-4:])
                    if group is not None and not block.is_null and block.pool is me:
                        slots.append((i, group))
            return slots

        def _victim(self, head: Any, group: int, taken: set[int],
                    found: list[dict[int, dict[int, Any]]]) -> Any:
            """The block of `group` to take where vLLM would take the state block `head`.
            A state spans one block per Mamba group and is usable only whole, so the
            victim is chosen per state: the first of `head`'s groups to come up chooses
            it (`replacing`), the others follow, each taking `head` itself where the
            victim's block of its group is no longer free. `found`: `_free_states` once
            walked (empty until then)."""
            state = head.block_hash[:-4]  # get_block_hash
            victim = self.marconi_replacing.get(state)
            if victim is None:
                if not found:
                    found.append(self._free_states())
                skip = taken - {head.block_id}
                chosen = order.pick(found[0][group], skip)
                if order.check:
                    self._check(chosen, group, skip, found[0][group])
                victim = chosen.block_hash[:-4]
                if victim != state:
                    if len(self.marconi_replacing) > 4096:  # states long gone
                        self.marconi_replacing.clear()
                    self.marconi_replacing[state] = victim
            pick = self.cached_block_hash_to_block.get_one_block(victim + _suffix(group))
            if pick is None or pick.ref_cnt != 0 or pick.block_id in taken:
                return head
            return pick

    return MarconiBlockPool


def _free(free: Any, integration: Integration) -> Any:
    """`KVCacheManager.free`, then a finished request to the tuner (a preempted one is
    freed too, and is not handed over)."""
    clocks = _Clocks(integration.counters)
    assert isinstance(integration.order, StateOrder)
    order: StateOrder = integration.order

    def marconi_free(self: Any, request: Any) -> None:
        pool, start = self.block_pool, _now()
        past = _past_last_state(pool, request) \
            if getattr(pool, "marconi_states", None) is not None and pool.marconi_orphans_first \
            else None
        clocks.past(_now() - start)
        if order.check and getattr(pool, "marconi_states", None) is not None \
                and pool.marconi_orphans_first:
            _check_past(pool, request, self.coordinator.get_blocks(request.request_id), past)
        free(self, request)
        if past:
            start, orphans = _now(), pool.marconi_orphans
            for block in past:
                if block.ref_cnt == 0 and block.block_hash is not None:
                    orphans[block.block_id] = block
            clocks.past(_now() - start)
        if not request.is_finished():
            return
        counters = integration.counters
        counters.requests += 1
        tuning = integration.tuning
        if tuning is not None:
            _hand_over(tuning, counters, request, self.kv_cache_config)
        if counters.requests % REPORT_EVERY == 0:
            per = 1e3 * counters.requests
            log.info("marconi: %d requests finished; in the scheduling loop %.0f us/request "
                     "(ordering %.0f: books %.0f, states cached %.0f, allocations %.0f, "
                     "finished %.0f; hand-over %.0f); alpha %g (%s)", counters.requests,
                     (counters.order_ns + counters.feed_ns) / per, counters.order_ns / per,
                     counters.books_ns / per, counters.record_ns / per,
                     counters.choose_ns / per, counters.past_ns / per,
                     counters.feed_ns / per, integration.order.alpha,
                     "fixed" if tuning is None else tuning.status())

    return marconi_free


def _hand_over(tuning: Tuning, counters: Counters, request: Any, kv_cache_config: Any
               ) -> None:
    """A finished request's tokens to the tuner (started at the first)."""
    if not tuning.started:  # once: its cost is logged, not counted per request
        began = time.perf_counter()
        _start(tuning, kv_cache_config)
        log.info("marconi: tuner started in %.0f ms (%s)", 1e3 * (time.perf_counter() - began),
                 f"process {tuning.remote.pid}" if tuning.remote is not None else
                 "a thread" if tuning.background else "inline")
    start = _now()
    if tuning.remote is not None:  # the request's own list: packed as it is written
        tuning.feed(getattr(request, "_all_token_ids", request.all_token_ids),
                    int(request.num_prompt_tokens))
    else:
        tuning.feed(np.asarray(request.all_token_ids, dtype=np.int32),
                    int(request.num_prompt_tokens))
    if tuning.background:
        counters.feed_ns += _now() - start


def _past_last_state(pool: Any, request: Any) -> list[Any] | None:
    """A request's cached attention blocks that end past the deepest state cached on its
    sequence (whole: in every Mamba group), found through vLLM's own hash map: KV no hit
    can use once the request is gone. Its blocks are read from the attention groups'
    managers (`marconi_kv_blocks`), as `get_blocks` reads them."""
    hashes, size = request.block_hashes, pool.hash_block_size
    cache, suffixes = pool.cached_block_hash_to_block._cache, pool.marconi_state_suffixes
    last = 0
    for j in range(len(hashes) - 1, -1, -1):  # (the map holds a key with a block only)
        for suffix in suffixes:
            if hashes[j] + suffix not in cache:
                break
        else:  # cached in every Mamba group
            last = (j + 1) * size
            break
    # block i ends past `last` from i = last // kv_size on (None: no such block; no list
    # made, nor a slice, for the many requests without one)
    rid, past = request.request_id, None
    for blocks_of, kv_size in pool.marconi_kv_blocks:
        blocks = blocks_of.get(rid)
        if blocks:
            for i in range(last // kv_size, len(blocks)):
                block = blocks[i]
                if _hash_of(block) is not None and not block.is_null:
                    if past is None:
                        past = [block]
                    else:
                        past.append(block)
    return past


def _check_past(pool: Any, request: Any, blocks: tuple[list[Any], ...],
                past: list[Any] | None) -> None:
    """`_past_last_state` made the plain way (check mode): the deepest block hash whose
    state vLLM's map holds in every Mamba group (`get_one_block`), and the request's
    blocks as `get_blocks` gives them."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    hashes, map_ = request.block_hashes, pool.cached_block_hash_to_block
    last = 0
    for j in range(len(hashes) - 1, -1, -1):
        if all(map_.get_one_block(make_block_hash_with_group_id(hashes[j], g)) is not None
               for g in pool.marconi_states):
            last = (j + 1) * pool.hash_block_size
            break
    plain = [b for g, kv_size, _ in pool.marconi_kv_groups
             for i, b in enumerate(blocks[g]) if (i + 1) * kv_size > last
             and not b.is_null and b.block_hash is not None]
    if [b.block_id for b in plain] != [b.block_id for b in past or ()]:
        raise IntegrationError(f"{WHO}: the KV past request {request.request_id}'s last "
                               f"state is {[b.block_id for b in past or ()]}, the plain "
                               f"way's {[b.block_id for b in plain]}")


def _start(tuning: Tuning, kv_cache_config: Any) -> None:
    """The tuner's mirror for the engine's pool: vLLM's memory (blocks x one block's bytes
    over a group's layers), block size and retention interval."""
    group = kv_cache_config.kv_cache_groups[0]
    memory = kv_cache_config.num_blocks * group.kv_cache_spec.page_size_bytes * len(
        group.layer_names)
    retention = kv_cache_config.prefix_cache_retention_interval
    system = (f"{MIRROR}:block_size={group.kv_cache_spec.block_size},"
              f"retention_interval={'none' if retention is None else retention}")
    tuning.start(system, memory, as_engine=True)
