"""`PrefixCache`: the cache an engine consults (semantics: docs/architecture.md).

One request's life:

```
plan = cache.lookup(input)          # hit length, node to resume from, checkpoints to take
cache.pin(plan.node)                # while the request runs
... prefill input[plan.hit:], capturing states at plan.checkpoints; decode output ...
cache.commit(input + output, len(input), states={pos: handle}, kv=source)
cache.unpin(plan.node)
```
Handles (`kv`, `state`) are opaque: byte sizes come from the `ModelSpec`, tensors (or
slot ids) are managed by a `StateStore`. The simulator passes no store and no states:
every requested checkpoint is then taken to be captured.

The cache runs the two policies it is given (`marconi.core.policy`); named systems
(`marconi.systems.make_cache`) build them. It never calls a tuner: its driver does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from marconi.core.evicting import Evicting
from marconi.core.policy import Action, Admission, Eviction, Victim
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, Handle, NullStore, StateStore
from marconi.core.stats import CacheStats
from marconi.core.tokens import Tokens, as_tokens
from marconi.core.tree import TOKEN_BYTES, Match, Node, RadixTree
from marconi.core.units import parse_size


@dataclass(frozen=True, slots=True)
class Plan:
    """What a lookup found and what prefill must capture.

    ```
    | cached (hit) | to prefill ............................ |
    0             hit          checkpoints...              n_input
    ```
    """

    hit: int  # tokens whose KV and SSM state are reused
    node: Node | None  # node holding the state after `hit` tokens (None: no hit)
    checkpoints: tuple[int, ...]  # positions in (hit, n_input] to capture in prefill
    matched: int  # tokens found in the tree (KV); beyond `hit` not reusable
    n_input: int


@dataclass(frozen=True, slots=True)
class CommitResult:
    admitted: tuple[int, ...]  # positions that gained a state
    node: Node | None  # node at the end of the committed sequence (None: refused)
    refused: bool  # True when the sequence could not fit even after evicting


class PrefixCache(Evicting):
    """A radix-tree prefix cache for hybrid models with a hard byte capacity.

    Invariants (checked by `check`): bytes held equal the sum over nodes and never
    exceed capacity after a commit; pinned nodes are never evicted; every node a
    lookup returns holds a state and spells a prefix of the input.
    """

    def __init__(self, spec: ModelSpec, capacity: int | str, admission: Admission,
                 eviction: Eviction, *, name: str = "custom", store: StateStore | None = None,
                 on_evict: Callable[[Freed], None] | None = None) -> None:
        """`admission` and `eviction`: fresh policy instances this cache owns (one of each
        per cache); `name` labels it in reports (a registered system's name)."""
        self.spec = spec
        self.capacity = parse_size(capacity)
        self.name = name
        self.admission = admission.for_model(spec)
        self.eviction = eviction
        self.store: StateStore = store if store is not None else NullStore()
        self.on_evict = on_evict
        self.tree = RadixTree()
        self.stats = CacheStats()
        self.clock = 0
        self.pinned: set[Node] = set()  # nodes with pins > 0 (what no eviction may free)

    # --- lookup --------------------------------------------------------------------

    def lookup(self, tokens: object, *, boundaries: Sequence[int] = ()) -> Plan:
        """Find the longest reusable prefix of `tokens` and plan the checkpoints.

        `boundaries` are message ends inside the input (token offsets), for admission
        policies that use them. Advances the clock; touches what the eviction policy says
        a hit touches. A model without SSM layers (a Transformer) reuses every matched
        token, KV being sliceable: its hit is the matched length and `node` the deepest
        node matched in full.
        """
        tok = self._tokens(tokens, "lookup")
        self.clock += 1
        key = tok.tobytes()
        match = self.tree.match(key)
        limit = self.admission.max_hit(len(tok))
        if self.spec.ssm_layers == 0:
            node, hit = match.node, min(match.length, limit)
        else:
            node = _deepest_state(match, limit)
            hit = node.depth if node is not None else 0
        checkpoints = self.admission.checkpoints_at(match, len(tok), hit, boundaries, key)
        plan = Plan(hit, node, checkpoints, match.length, len(tok))
        self.eviction.on_lookup(match.path, node, self.clock)
        self.stats.record_lookup(len(tok), hit)
        return plan

    def required_states(self, tokens: object, n_input: int, *,
                        boundaries: Sequence[int] = ()) -> tuple[int, ...]:
        """Positions whose state `commit(tokens, n_input)` would admit (no side effects)."""
        tok = self._tokens(tokens, "required_states")
        key = tok.tobytes()
        match = self.tree.match(key)
        held = {n.depth for n in match.path if n.has_state}
        positions = self.admission.positions_at(match, len(tok), n_input, boundaries, key)
        return tuple(p for p in positions if p not in held)

    # --- commit --------------------------------------------------------------------

    def commit(self, tokens: object, n_input: int, states: Mapping[int, Handle] | None = None,
               kv: Handle = None, *, boundaries: Sequence[int] = ()) -> CommitResult:
        """Insert input + output, admitting states where the admission policy says.

        Evicts first so that bytes never exceed capacity afterwards; if the sequence
        cannot fit even then, nothing is inserted (`refused`). `states` maps positions
        to captured handles (None: all captured); the cache owns them from here on and
        releases the ones it does not keep through the store. `boundaries`: as in `lookup`.
        """
        tok = self._tokens(tokens, "commit")
        if not 0 <= n_input <= len(tok):
            raise ValueError(f"commit: n_input={n_input!r} outside [0, {len(tok)}]")
        self.clock += 1
        self.stats.commits += 1
        return self._commit(tok, n_input, states, kv, boundaries)

    def _commit(self, tok: Tokens, n_input: int, states: Mapping[int, Handle] | None, kv: Handle,
                boundaries: Sequence[int]) -> CommitResult:
        key = tok.tobytes() if self.admission.caches else b""
        match = self.tree.match(key)
        positions = self.admission.positions_at(match, len(tok), n_input, boundaries, key)
        if key and self.admission.truncates:  # keep the sequence only up to its last state
            key = key[: max(positions, default=0) * TOKEN_BYTES]
            match = self.tree.match(key)
        if not key:  # nothing to keep: vanilla, or no state to end on
            self._release_unused(states, set())
            return CommitResult((), None, refused=False)
        wanted = self._wanted(match, positions, states)
        if not self._make_room(match, len(key) // TOKEN_BYTES, wanted):
            self._release_unused(states, set())
            self.stats.refused_commits += 1
            self.eviction.on_commit(match.path, (), self.clock)
            return CommitResult((), None, refused=True)
        result = self._insert(key, match, wanted, kv)
        self._grow_in_place(result)
        self._collect_garbage(set())
        self._release_unused(states, set(result.admitted))
        return result

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

    def _make_room(self, match: Match, n: int, wanted: dict[int, Handle]) -> bool:
        """Evict until the new tokens' KV and the wanted states fit; False, with nothing
        evicted, if they could not fit even with every unpinned entry beside the path
        gone (feasibility is decided before any eviction: docs/architecture.md)."""
        kv_need = (n - match.length) * self.spec.kv_bytes_per_token
        ssm_need = len(wanted) * self.spec.ssm_bytes
        if self.stats.bytes + kv_need + ssm_need <= self.capacity:
            return True
        protected = set(match.path)
        if match.partial is not None:
            protected.add(match.partial)
        if self.floor(protected) + kv_need + ssm_need > self.capacity:
            return False
        if self._evict_until(self.capacity - kv_need - ssm_need, protected, kv_need, ssm_need):
            return True
        self.stats.evicted_then_refused += 1  # a policy that could not reach the floor
        return False

    def floor(self, protected: Collection[Node] = ()) -> int:
        """Bytes no eviction can free: pinned nodes and `protected` ones (KV and state)."""
        kv, ssm = self.spec.kv_bytes_per_token, self.spec.ssm_bytes
        return sum(node.edge_len * kv + (ssm if node.has_state else 0)
                   for node in self.pinned.union(protected))

    def _insert(self, key: bytes, match: Match, wanted: dict[int, Handle],
                kv: Handle) -> CommitResult:
        n = len(key) // TOKEN_BYTES
        cuts = {*wanted, n}  # a node ends where the sequence ends
        if match.partial is not None and match.length < n:
            cuts.add(match.length)  # the radix structure needs a node where we leave
        at, created = self._cut_existing(match, sorted(c for c in cuts if c <= match.length))
        changed = {x for node in created for x in (node, *node.children.values())}
        base = at[match.length]
        new = self._append(base, key, match.length, sorted(c for c in cuts if c > match.length), kv)
        if new and base is not self.tree.root:
            changed.add(base)  # gained a child
        at.update((node.depth, node) for node in new)
        for pos, handle in wanted.items():
            at[pos].has_state, at[pos].state = True, handle
            changed.add(at[pos])
        admitted = tuple(sorted(wanted))
        self.stats.add_bytes(kv=(n - match.length) * self.spec.kv_bytes_per_token,
                             ssm=len(admitted) * self.spec.ssm_bytes)
        self.stats.states_admitted += len(admitted)
        end = at[n]
        self.eviction.on_commit(self.tree.path_to(end), [*created, *new], self.clock)
        for node in changed:
            self.eviction.changed(node)
        return CommitResult(admitted, end, refused=False)

    def _grow_in_place(self, result: CommitResult) -> None:
        """Merge away the states the admission says this commit superseded."""
        if result.node is None:
            return
        path = self.tree.path_to(result.node)
        for node in self.admission.superseded(path, result.node.depth):
            if node.has_state and len(node.children) == 1 and not node.pins:
                self._evict(Victim(node, Action.MERGE), replaced=True)

    def _cut_existing(self, match: Match, cuts: list[int]) -> tuple[dict[int, Node], list[Node]]:
        """Make a node end at each cut inside the matched part; map depth -> node."""
        at = {0: self.tree.root} | {node.depth: node for node in match.path}
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
            if head.pins:
                self.pinned.add(head)
            head.kv, node.kv = self.store.kv_split(node.kv, offset)
            at[cut] = head
            created.append(head)
        return at, created

    def _append(self, parent: Node, key: bytes, start: int, cuts: list[int],
                kv: Handle) -> list[Node]:
        """Hang the unmatched tail [start, n) under `parent`, one node per segment."""
        n = len(key) // TOKEN_BYTES
        new: list[Node] = []
        for stop in [*[c for c in cuts if c < n], n] if start < n else []:
            leaf = self.tree.insert(parent, key[start * TOKEN_BYTES : stop * TOKEN_BYTES])
            leaf.kv = self.store.kv_slice(kv, start, stop)
            new.append(leaf)
            parent, start = leaf, stop
        return new

    def _release_unused(self, states: Mapping[int, Handle] | None, kept: set[int]) -> None:
        for pos, handle in (states or {}).items():
            if pos not in kept and handle is not None:
                self.store.release(None, handle)

    # --- pins ----------------------------------------------------------------------

    def pin(self, node: Node | None) -> None:
        """Protect `node` and its ancestors from eviction until `unpin`. None: no-op."""
        for n in self.path(node):
            n.pins += 1
            if n.pins == 1:
                self.pinned.add(n)
                self.eviction.changed(n)

    def unpin(self, node: Node | None) -> None:
        """Undo one `pin(node)`."""
        path = self.path(node)
        if any(n.pins <= 0 for n in path):
            raise ValueError(f"unpin of {node!r}, which is not pinned")
        for n in path:
            n.pins -= 1
            if n.pins == 0:
                self.pinned.discard(n)
                self.eviction.changed(n)

    def path(self, node: Node | None) -> list[Node]:
        """Nodes from the root (excluded) to `node`: their edges' KV spell its prefix."""
        return self.tree.path_to(node) if node is not None else []

    # --- helpers --------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        """The eviction's weight of FLOP efficiency (0.0 for policies without one)."""
        return self.eviction.alpha if self.eviction.alpha is not None else 0.0

    @property
    def bytes(self) -> int:
        return self.stats.bytes

    @staticmethod
    def _tokens(tokens: object, where: str) -> Tokens:
        tok = as_tokens(tokens, what=f"{where}: tokens")
        if tok.size == 0:
            raise ValueError(f"{where}: empty token list")
        return tok


def _early(states: Mapping[int, Handle], after: int, before: int) -> int | None:
    """The latest supplied position strictly between `after` and `before`."""
    inside = [q for q in states if after < q < before]
    return max(inside) if inside else None


def _deepest_state(match: Match, limit: int) -> Node | None:
    """Deepest matched node holding a state within the first `limit` tokens."""
    for node in reversed(match.path):
        if node.has_state and node.depth <= limit:
            return node
    return None

