"""llama.cpp's server slots with context checkpoints, for hybrid and recurrent models
(`--ctx-checkpoints N`, 32 by default; docs/peers.md, "Other baselines").

A llama.cpp slot holds one sequence: the KV of its tokens and the recurrent state at its
end (the live state), plus up to N checkpoints of the recurrent state taken near the end
of each prompt's processing, oldest dropped first. A request reuses the longest prefix of
its input that the slot can resume: its live state when the input extends the slot's
whole sequence, else the deepest checkpoint at or before where they part; the slot then
holds the new sequence, and what lay past the parting point (KV, checkpoints, the old
live state) is gone.

Here a slot is a namespace of the cache (`salt`): the simulator passes each request's
session, so every session has a slot of its own (`Admission.per_session`); a driver that
names no session runs everything in the one default slot (llama.cpp with one slot).
- `ContextCheckpoints` (admission): a checkpoint one token before the prompt's end (the
  last prompt token is always computed again, to sample from), and the live state at the
  end of what was computed (`n_input + n_output - 1`: the last sampled token is never fed);
  the sequence is kept up to it.
- `SlotFIFO` (eviction): after each commit, the slot keeps only its new sequence (leaves
  off it are removed: evictions), the states on it that are its live state or one of its
  newest N checkpoints (an earlier live state is replaced in place, `superseded`; any
  other state dropped: an eviction); under memory pressure the least recently used slot
  goes, tail first.
The two share a `SlotBook`: where the admission put the commit's checkpoint and live state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from marconi.core.policy import Action, Admission, Eviction, Victim, alive
from marconi.core.tree import Match, Node


@dataclass(slots=True)
class Slot:
    """One slot's books."""

    root: Node  # its namespace's root
    last_use: int = 0  # clock of its latest lookup or commit
    end: Node | None = None  # the end of its sequence (the live state)
    checkpoints: deque[int] = field(default_factory=deque)  # depths, oldest first


class SlotBook:
    """What the admission and the eviction tell each other about the commit under way."""

    def __init__(self) -> None:
        self.pending: tuple[int, int] = (0, 0)  # its (checkpoint depth, live depth)
        self.keep: set[int] = set()  # depths its slot keeps a state at, once committed


class ContextCheckpoints(Admission):
    """A checkpoint one token before the prompt's end and the live state at the end."""

    per_session = True
    truncates = True  # the slot holds what it computed, up to the live state

    def __init__(self, book: SlotBook) -> None:
        self.book = book

    def max_hit(self, n_input: int) -> int:
        return max(n_input - 1, 0)

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        point = n_input - 1
        return (point,) if point > hit else ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        point, live = n_input - 1, n_input + max(n_total - n_input - 1, 0)
        self.book.pending = (point, live)
        return tuple(sorted({p for p in (point, live) if p > 0}))

    def superseded(self, path: Sequence[Node], n_total: int) -> tuple[Node, ...]:
        """States on the slot's sequence that are neither its live state nor one of its
        checkpoints (an earlier live state the slot computed past): replaced in place."""
        return tuple(n for n in path if n.has_state and n.depth not in self.book.keep)


def _root(node: Node) -> Node:
    while node.parent is not None:
        node = node.parent
    return node


def _leaves(root: Node) -> Iterator[Node]:
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(node.children.values())
        else:
            yield node


class SlotFIFO(Eviction):
    """Each slot its own sequence and newest `checkpoints` checkpoints; the least recently
    used slot leaves first under memory pressure."""

    def __init__(self, book: SlotBook, checkpoints: int = 32) -> None:
        super().__init__()
        if checkpoints < 1:
            raise ValueError(f"a slot keeps at least one checkpoint, got {checkpoints!r}")
        self.book, self.limit = book, checkpoints
        self.slots: dict[Node, Slot] = {}  # by namespace root
        self.ends: dict[Node, Slot] = {}  # each slot's end node, to the slot
        self.dirty: Slot | None = None  # the slot the latest commit changed

    def _slot(self, root: Node) -> Slot:
        slot = self.slots.get(root)
        if slot is None:
            slot = self.slots[root] = Slot(root)
        return slot

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        nodes = list(path)
        if nodes and nodes[0].parent is not None:
            self._slot(nodes[0].parent).last_use = now

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        nodes = list(path)
        if not nodes or nodes[0].parent is None:
            return
        slot = self._slot(nodes[0].parent)
        for node in nodes:
            self.stamp[node] = now
        point, live = self.book.pending
        if nodes[-1].depth != live:  # a refused commit: the slot only saw a use
            slot.last_use = now
            return
        if slot.end is not None:
            self.ends.pop(slot.end, None)
        slot.last_use, slot.end = now, nodes[-1]
        self.ends[slot.end] = slot
        if point > 0 and point not in slot.checkpoints:
            slot.checkpoints.append(point)
        # checkpoints past where the new sequence parts from the old one are gone with it
        held = {n.depth for n in nodes if n.has_state}
        kept = [d for d in slot.checkpoints if d in held][-self.limit:]
        slot.checkpoints = deque(kept)
        self.book.keep = {*kept, slot.end.depth}
        self.dirty = slot

    def changed(self, node: Node) -> None:
        return None

    def removed(self, node: Node) -> None:
        super().removed(node)
        slot = self.ends.pop(node, None)
        if slot is not None and slot.end is node:  # its live state left with it
            slot.end = None

    def garbage(self, protected: Collection[Node]) -> Victim | None:
        slot = self.dirty
        if slot is None or slot.end is None or not alive(slot.end):
            self.dirty = None
            return None
        on_path = set()
        cur: Node | None = slot.end
        while cur is not None and cur.parent is not None:
            on_path.add(cur)
            cur = cur.parent
        for leaf in _leaves(slot.root):  # what lay past the parting point
            if leaf not in on_path and not leaf.pins and leaf not in protected:
                return Victim(leaf, Action.REMOVE)
        keep = set(slot.checkpoints)
        for node in on_path:  # states that are neither the live one nor a checkpoint
            if node.has_state and node is not slot.end and node.depth not in keep \
                    and not node.pins and node not in protected:
                return Victim(node, Action.DROP_STATE)
        self.dirty = None
        return None

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        for root in [r for r, s in self.slots.items() if not r.children and s.end is None]:
            del self.slots[root]  # emptied: nothing left to choose from
        for slot in sorted(self.slots.values(), key=lambda s: (s.last_use, s.root.id)):
            for leaf in _leaves(slot.root):
                if not leaf.pins and leaf not in protected:
                    return Victim(leaf, Action.REMOVE)
        return None

    def check(self, nodes: Sequence[Node]) -> None:
        for slot in self.slots.values():
            assert len(slot.checkpoints) <= self.limit, "a slot holds too many checkpoints"
            assert slot.end is None or alive(slot.end), "a slot's end left the tree"
        for node in nodes:
            assert _root(node) in self.slots, f"{node!r} is in no slot"
