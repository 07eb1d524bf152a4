"""What the vLLM plugin records: `BookedPool`, vLLM's `BlockPool` whose hooks keep
`StateOrder`'s books of the cached Mamba states (each state's depth, the nearest cached
state above it and its efficiency, fixed when it is cached; the keys a hit on it needs,
and which states lost one) and the free cached KV no hit can use (`marconi_orphans`: the
blocks past a freed request's last state, `past_last_state`). `booked` says when a hook
may skip a block the books already hold as recording it would leave them.

It imports vLLM (its environment only: `hooks.install` imports it), and reads a block's
hash and depth from the fields the installed version keeps them in (`block_fields`)."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import vllm
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id, resolve_block_hashes

from marconi.engines.integrations.common import Counters, IntegrationError
from marconi.engines.integrations.vllm.costs import Clocks, now
from marconi.engines.integrations.vllm.order import StateOrder
from marconi.engines.integrations.vllm.versions import WHO, block_fields

# a cached block's hash and the tokens it covers, read where this vLLM keeps them (up to
# 0.33 the slots behind the properties `block_hash` / `block_hash_num_tokens`: a call
# less each, in the hooks' loops)
hash_of, depth_of = (attrgetter(name) for name in block_fields(str(vllm.__version__)))


def group_suffix(group: int) -> bytes:
    """What vLLM's `make_block_hash_with_group_id` appends to a block hash for `group`: a
    hook joins the two bytes itself, a function call saved per key."""
    return group.to_bytes(4, "big")


def booked(order: StateOrder, block: Any, key: Any, last: tuple[Any, Any]) -> bool:
    """Whether the pool's `_record` of `block` (cached again; `key`, its hash, not None)
    would change nothing, so the hooks skip it: the state last recorded (`last`, the
    pool's `marconi_last`: that state and its above-tuple) is the block's, at the block's
    depth, and the books hold the block with that state and that very above-tuple, and the
    state's keys. The same test `_record` makes, made before the call."""
    return (last[0] == key[:-4] and last[1][0] == depth_of(block)
            and order.above.get(block.block_id) is last[1]
            and order.state_of.get(block.block_id) == last[0]
            and last[0] in order.keys_of)


class BookedPool(BlockPool):
    """vLLM's `BlockPool`, its hooks keeping the books of the cached Mamba states and of
    the orphan KV (`pool.MarconiBlockPool` chooses from them). Every hook times what it
    adds (`marconi_clocks`), vLLM's own work left out."""

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
    # the integration's order, counters and the clocks of its hooks; set by the
    # coordinator's hook with the groups
    marconi_order: StateOrder
    marconi_counters: Counters
    marconi_clocks: Clocks

    def cache_full_blocks(self, request: Any, blocks: list[Any], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                  block_size, kv_cache_group_id, block_mask)
        states = self.marconi_states
        if states is not None and kv_cache_group_id in states \
                and num_full_blocks > num_cached_blocks:
            start, order = now(), self.marconi_order
            for i in range(num_cached_blocks, num_full_blocks):
                block = blocks[i]  # (align mode: a state per scheduled step only)
                key = hash_of(block)
                if key is None:  # null or masked: no state (`_record` would return)
                    continue
                # `_record`, unless the block is in the books as it would leave them
                if not booked(order, block, key, self.marconi_last):
                    self._record(request, block, kv_cache_group_id)
            self.marconi_clocks.record(now() - start)

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> Any:
        out = super().cache_partial_block(request, block, num_tokens, kv_cache_group_id,
                                          block_size, replace_existing_hashes)
        states = self.marconi_states
        if out is not None and states is not None and kv_cache_group_id in states:
            start, key, last = now(), hash_of(block), self.marconi_last
            # most calls cache a block again as it is in the books (a step's partial
            # entry after its full block): `_record` would change nothing, and is not
            # called (the same test as its own, which `_record` then makes again)
            if key is not None and not booked(self.marconi_order, block, key, last):
                self._record(request, block, kv_cache_group_id)
            self.marconi_clocks.record(now() - start)
        return out

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
        start, order = now(), self.marconi_order
        above = order.above.get(src_block.block_id)
        state = order.state_of.get(src_block.block_id)
        keys = order.keys_of.get(state) if state is not None else None
        self.marconi_clocks.books(now() - start)
        super().move_block_hashes(src_block, dst_block)  # forgets src (below)
        if above is not None and state is not None:
            start = now()
            order.note(dst_block.block_id, state, above)
            if keys is not None and state not in order.keys_of:
                order.depend(state, keys, self._is_cached())
            self.marconi_clocks.books(now() - start)

    def _remove_cached_block_hashes(self, block: Any) -> list[Any]:
        removed: list[Any] = super()._remove_cached_block_hashes(block)
        if removed and self.marconi_states is not None:  # taken, its hash replaced or dropped
            start, block_id, order = now(), block.block_id, self.marconi_order
            if self.marconi_orphans:
                self.marconi_orphans.pop(block_id, None)
            if block_id in order.state_of:
                order.forget(block_id)
            needed, cached = order.needed_by, self.cached_block_hash_to_block._cache
            for key in removed:
                if key in needed and key not in cached:
                    order.removed(key)
            self.marconi_clocks.books(now() - start)
        return removed

    def _insert_block_hash(self, block_hash_with_group_id: Any, block: Any,
                           num_tokens: int | None) -> None:
        super()._insert_block_hash(block_hash_with_group_id, block, num_tokens)
        order = self.marconi_order
        users = order.needed_by.get(block_hash_with_group_id)
        if users and not order.dead.isdisjoint(users):  # else it changes nothing
            start = now()
            order.inserted(block_hash_with_group_id, self._is_cached())
            self.marconi_clocks.books(now() - start)

    def reset_prefix_cache(self) -> bool:
        done: bool = super().reset_prefix_cache()
        if done and self.marconi_states is not None:
            order = self.marconi_order
            self.marconi_orphans.clear()
            self.marconi_replacing.clear()
            order.clear()
        return done

    def touch(self, blocks: Any) -> None:
        orphans = self.marconi_orphans
        if self.marconi_states is not None and self.marconi_order.counts_hits:
            start = now()
            self.marconi_order.touched(blocks)
            self.marconi_clocks.books(now() - start)
        if orphans:
            start = now()
            for block in blocks:
                if block.ref_cnt == 0:
                    orphans.pop(block.block_id, None)
            self.marconi_clocks.books(now() - start)
        super().touch(blocks)

    def _record(self, request: Any, block: Any, group: int) -> None:
        """Block `block`'s state in the books: its depth, and that of the nearest
        cached state above it (same group) on the request's prefix, found through
        vLLM's own hash map (by the state's first block to come up: the others share
        it); on its first block, what a hit on it needs."""
        key = hash_of(block)  # (up to 0.33 the slot behind `block_hash`: a call less)
        if key is None or block.is_null:
            return
        order = self.marconi_order
        depth, state = int(depth_of(block)), key[:-4]  # get_block_hash
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
        size, suffix = self.hash_block_size, group_suffix(group)
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


def past_last_state(pool: Any, request: Any) -> list[Any] | None:
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
                if hash_of(block) is not None and not block.is_null:
                    if past is None:
                        past = [block]
                    else:
                        past.append(block)
    return past


def check_past(pool: Any, request: Any, blocks: tuple[list[Any], ...],
               past: list[Any] | None) -> None:
    """`past_last_state` made the plain way (check mode): the deepest block hash whose
    state vLLM's map holds in every Mamba group (`get_one_block`), and the request's
    blocks as `get_blocks` gives them."""
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
