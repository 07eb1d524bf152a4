"""Insertion mechanics of `PrefixCache`: carry out a commit's insert with exact books.

A mixin beside `marconi.core.evicting`, so that `cache.py` reads as the request's life.
A commit that fits (`Evicting._make_room` decided) cuts the matched part where nodes must
end, hangs the unmatched tail under it, admits the wanted states and tells the eviction
policy; KV bytes follow the layout (`marconi.core.layout.PageBooks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marconi.core.evicting import Evicting
from marconi.core.policy import Action, Admission, Victim
from marconi.core.state_store import Handle
from marconi.core.tree import TOKEN_BYTES, Match, Node


@dataclass(frozen=True, slots=True)
class CommitResult:
    admitted: tuple[int, ...]  # positions that gained a state
    node: Node | None  # node at the end of the committed sequence (None: refused)
    refused: bool  # True when the sequence could not fit even after evicting


class Inserting(Evicting):
    """Needs what `Evicting` needs, and the cache's admission policy."""

    admission: Admission

    def _wanted(self, match: Match, positions: tuple[int, ...],
                states: Mapping[int, Handle] | None) -> dict[int, Handle]:
        """Positions that should gain a state, with their handles.

        A state captured early stands in for a wanted position that has none: the
        engine's chunk-boundary capture lands up to one scan chunk before `p`, so the
        latest supplied state in (previous wanted position, p) is admitted where it lies.
        """
        held = {node.depth for node in match.path if node.has_state}
        out: dict[int, Handle] = {}
        previous = 0
        for p in positions:
            if p in held:
                pass
            elif states is None:
                out[p] = None
            elif p in states:
                out[p] = states[p]
            elif (q := _early(states, previous, p)) is not None and q not in held:
                out[q] = states[q]
            else:
                self.stats.states_not_captured += 1
            previous = p
        return out

    def _insert(self, key: bytes, match: Match, wanted: dict[int, Handle], kv: Handle,
                root: Node) -> tuple[CommitResult, list[Node]]:
        """Insert the sequence; returns the result and the path to its end node."""
        n = len(key) // TOKEN_BYTES
        kv_bytes = self.books.need(match, n)
        cuts = {*wanted, n}  # a node ends where the sequence ends
        if match.partial is not None and match.length < n:
            cuts.add(match.length)  # the radix structure needs a node where we leave
        at, created = self._cut_existing(match, sorted(c for c in cuts if c <= match.length),
                                         root)
        changed = {x for node in created for x in (node, *node.children.values())}
        base = at[match.length]
        new = self._append(base, key, match.length, sorted(c for c in cuts if c > match.length), kv)
        if new and base is not root:
            changed.add(base)  # gained a child
        at.update((node.depth, node) for node in new)
        for pos, handle in wanted.items():
            at[pos].has_state, at[pos].state = True, handle
            changed.add(at[pos])
        admitted = tuple(sorted(wanted))
        self.stats.add_bytes(kv=kv_bytes, ssm=len(admitted) * self.ssm_bytes,
                             states=len(admitted))
        self.stats.states_admitted += len(admitted)
        end = at[n]
        path = self.tree.path_to(end)
        self.eviction.on_commit(path, [*created, *new], self.clock)
        for node in changed:
            self.eviction.changed(node)
        return CommitResult(admitted, end, refused=False), path

    def _grow_in_place(self, end: Node, path: list[Node]) -> None:
        """Merge away the states the admission says this commit superseded (`path`: the
        nodes down to the committed sequence's `end`)."""
        for node in self.admission.superseded(path, end.depth):
            if node.has_state and len(node.children) == 1 and not node.pins:
                self._evict(Victim(node, Action.MERGE), replaced=True)

    def _cut_existing(self, match: Match, cuts: list[int],
                      root: Node) -> tuple[dict[int, Node], list[Node]]:
        """Make a node end at each cut inside the matched part; map depth -> node. A cut
        inside a page shares that page between head and tail."""
        at = {0: root} | {node.depth: node for node in match.path}
        segs = [*match.path, *([match.partial] if match.partial is not None else [])]
        created, i = [], 0
        for cut in cuts:
            if cut in at:
                continue
            while segs[i].depth < cut:
                i += 1
            node = segs[i]
            offset = cut - (node.depth - node.edge_len)
            head = self.tree.split(node, offset)
            self.books.split(head, node)
            if head.pins:
                self.pinned.add(head)
            head.kv, node.kv = self.store.kv_split(node.kv, offset)
            at[cut] = head
            created.append(head)
        return at, created

    def _append(self, parent: Node, key: bytes, start: int, cuts: list[int],
                kv: Handle) -> list[Node]:
        """Hang the unmatched tail [start, n) under `parent`, one node per segment: the
        first is a new branch (a copy of the page it starts in, if that began in the
        parent); the others continue the same sequence and share pages."""
        n = len(key) // TOKEN_BYTES
        new: list[Node] = []
        for stop in [*[c for c in cuts if c < n], n] if start < n else []:
            leaf = self.tree.insert(parent, key[start * TOKEN_BYTES : stop * TOKEN_BYTES])
            leaf.kv = self.store.kv_slice(kv, start, stop)
            if not new:
                self.books.branched(leaf)
            new.append(leaf)
            parent, start = leaf, stop
        return new

    def _release_unused(self, states: Mapping[int, Handle] | None, kept: set[int]) -> None:
        for pos, handle in (states or {}).items():
            if pos not in kept and handle is not None:
                self.store.release(None, handle)


def _early(states: Mapping[int, Handle], after: int, before: int) -> int | None:
    """The latest supplied position strictly between `after` and `before`."""
    inside = [q for q in states if after < q < before]
    return max(inside) if inside else None
