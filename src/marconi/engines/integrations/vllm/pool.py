"""Which Mamba states leave vLLM's pool: `MarconiBlockPool`, what `hooks.install` puts in
`kv_cache_coordinator` as its `BlockPool`. vLLM takes new blocks from the head of its free
queue; the pool takes as many, and the same KV blocks, with the free cached KV no hit can
use first (`marconi_orphans`), and where a block it takes is a cached Mamba state it takes
in its place the free state that comes first in Marconi's order (`order.StateOrder.pick`,
over the group's free states found by one walk of the queue), whole: every group's block
of it. The blocks go to the head of the queue, taken by vLLM's own `get_new_blocks`. It
imports vLLM (through `books`)."""

from __future__ import annotations

from typing import Any

from marconi.engines.integrations.common import IntegrationError
from marconi.engines.integrations.vllm.books import BookedPool, group_suffix, hash_of
from marconi.engines.integrations.vllm.costs import now
from marconi.engines.integrations.vllm.versions import WHO, pool_self


class MarconiBlockPool(BookedPool):
    """vLLM's `BlockPool`; when a block it takes is a cached Mamba state, Marconi's
    order says which state goes (marconi.engines.integrations.vllm)."""

    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        chosen = self._marconi_choice(num_blocks)
        if chosen is None:
            return super().get_new_blocks(num_blocks)
        start, queue = now(), self.free_block_queue
        for block in chosen:  # to the head of the queue, where vLLM takes from
            queue.remove(block)
        queue.prepend_n(chosen)
        self.marconi_clocks.choose(now() - start)
        taken: list[Any] = super().get_new_blocks(num_blocks)
        start = now()
        if [b.block_id for b in taken] != [b.block_id for b in chosen]:
            raise IntegrationError(f"{WHO}: vLLM took other blocks than the ones put at "
                                   "the head of its free queue")
        self.marconi_clocks.choose(now() - start)
        return taken  # each cached one left the books as its hash went (`books`)

    def _check(self, chosen: Any, group: int, skip: set[int], found: dict[int, Any]
               ) -> None:
        """The same choice made the plain way (`StateOrder.first` over the free states
        as vLLM's queue and the blocks say), and what the quick one read: the
        candidates (`found`, `_free_states`) and the books."""
        ends, me, order = self.marconi_state_ends, pool_self(self), self.marconi_order
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
        self.marconi_counters.checked += 1

    def _marconi_choice(self, num_blocks: int) -> list[Any] | None:
        """The blocks to take, in Marconi's order; None: vLLM's own (alpha 0, nothing
        cached among them, or a request vLLM refuses). Free uncached blocks first, as
        vLLM takes them; then cached KV no hit can reach (`marconi_orphans`); then
        vLLM's queue, each state in it standing for the state Marconi's order
        evicts."""
        order, counters, clocks = self.marconi_order, self.marconi_counters, self.marconi_clocks
        states = self.marconi_states
        if states is None or not self.enable_caching:
            return None
        if num_blocks > self.get_num_free_blocks() \
                or (order.by_recency() and not (self.marconi_orphans_first
                                                and self.marconi_orphans)):
            return None
        start = now()
        head: list[Any] = []
        block = self.free_block_queue.fake_free_list_head.next_free_block
        while len(head) < num_blocks and block.block_hash is None:
            head.append(block)
            block = block.next_free_block
        if len(head) == num_blocks:  # uncached blocks only: vLLM's own choice
            clocks.choose(now() - start)
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
        # where the score is recency's alone (alpha 0) states go in vLLM's order
        slots = [] if order.by_recency() else self._state_slots(head)
        if not slots and not took_orphans:  # the queue's head, in its order: vLLM's own
            clocks.choose(now() - start)
            return None
        chosen, taken = list(head), {b.block_id for b in head}
        found: list[dict[int, dict[int, Any]]] = []  # `_free_states`, walked once if asked
        for i, group in slots:
            pick = self._victim(head[i], group, taken, found)
            taken.add(pick.block_id)
            chosen[i] = pick
            counters.victims += 1
        counters.walks += 1
        clocks.choose(now() - start)
        return chosen

    def _free_states(self) -> dict[int, dict[int, Any]]:
        """Each Mamba group's free cached states (block id -> block), in vLLM's free
        queue order: one walk of the queue, when a choice needs them (some times in a
        hundred requests, where books kept beside the queue cost its hooks some
        thirty calls a request)."""
        states, ends = self.marconi_states, self.marconi_state_ends
        assert states is not None
        found: dict[int, dict[int, Any]] = {g: {} for g in states}
        of_byte, me, key_of = self.marconi_state_of_byte, pool_self(self), hash_of
        block = self.free_block_queue.fake_free_list_head.next_free_block
        while block.next_free_block is not None:  # (the fake tail has none)
            key = key_of(block)
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
        me, key_of = pool_self(self), hash_of
        for i, block in enumerate(head):
            key = key_of(block)
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
            order = self.marconi_order
            chosen = order.pick(found[0][group], skip)
            if order.check:
                self._check(chosen, group, skip, found[0][group])
            victim = chosen.block_hash[:-4]
            if victim != state:
                if len(self.marconi_replacing) > 4096:  # states long gone
                    self.marconi_replacing.clear()
                self.marconi_replacing[state] = victim
        pick = self.cached_block_hash_to_block.get_one_block(victim + group_suffix(group))
        if pick is None or pick.ref_cnt != 0 or pick.block_id in taken:
            return head
        return pick
