"""`PrefixCache`: the cache an engine consults (semantics: docs/architecture.md).

One request's life:

```
plan = cache.lookup(input)          # hit length, node to resume from, checkpoints to take
cache.pin(plan.node)                # while the request runs
... prefill input[plan.hit:], capturing states at plan.checkpoints; decode output ...
cache.commit(input + output, len(input), states={pos: handle}, kv=source)
cache.unpin(plan.node)
```
Handles (`kv`, `state`) are opaque: byte sizes come from the `ModelSpec` and the layout
(`marconi.core.layout`: one byte budget, or KV pages beside a state-slot pool), tensors
(or page and slot ids) are managed by a `StateStore`. The simulator passes no store and no
states: every requested checkpoint is then taken to be captured. `peek` plans without
any side effect; `salt` keeps namespaces apart (docs/embedding.md).

Not thread-safe: one thread (or one lock) drives a cache and its store.

The cache runs the two policies it is given (`marconi.core.policy`); named systems
(`marconi.systems.make_cache`) build them. It never calls a tuner: its driver does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from marconi.core.inserting import CommitResult, Inserting
from marconi.core.layout import Layout, PageBooks
from marconi.core.policy import Admission, Eviction
from marconi.core.spec import ModelSpec
from marconi.core.state_store import Freed, Handle, NullStore, StateStore
from marconi.core.stats import CacheStats
from marconi.core.tokens import Tokens, as_tokens
from marconi.core.tree import TOKEN_BYTES, Match, Node, RadixTree, Salt, check_salt
from marconi.core.units import parse_size

__all__ = ["CommitResult", "Plan", "PrefixCache"]


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


class PrefixCache(Inserting):
    """A radix-tree prefix cache for hybrid models with a hard memory capacity.

    Invariants (checked by `marconi.core.integrity`): bytes held equal the sum over nodes
    (whole pages when paged) and never exceed capacity after a commit, nor states the slot
    pool; pinned nodes are never evicted; every node a lookup returns holds a state and
    spells a prefix of the input in the lookup's namespace.
    """

    def __init__(self, spec: ModelSpec, capacity: int | str, admission: Admission,
                 eviction: Eviction, *, name: str = "custom", store: StateStore | None = None,
                 on_evict: Callable[[Freed], None] | None = None, page_size: int = 1,
                 state_slots: int = 0) -> None:
        """`admission` and `eviction`: fresh policy instances this cache owns (one of each
        per cache); `name` labels it in reports (a registered system's name). `page_size`:
        tokens per KV page; `state_slots`: a pool of that many states carved out of
        `capacity` (0: states share the byte budget). Defaults: the paper's byte budget."""
        self.spec = spec
        self.ssm_bytes = spec.ssm_bytes
        self.capacity = parse_size(capacity)
        self.layout = Layout(page_size=page_size, state_slots=state_slots)
        self.kv_capacity = self.layout.kv_capacity(spec, self.capacity)
        self.books = PageBooks(self.layout, spec.kv_bytes_per_token)
        self.name = name
        self.admission = admission.for_model(spec)
        self.eviction = eviction
        self.store: StateStore = store if store is not None else NullStore()
        self.on_evict = on_evict
        self.tree = RadixTree()
        self.stats = CacheStats()
        self.clock = 0
        self.pinned: set[Node] = set()  # nodes with pins > 0 (what no eviction may free)
        # the last lookup's (key, salt, match, tree version): its commit resumes the walk
        self._looked: tuple[bytes, Salt, Match, int] | None = None

    # --- lookup --------------------------------------------------------------------

    def lookup(self, tokens: object, *, boundaries: Sequence[int] = (),
               salt: Salt = None) -> Plan:
        """Find the longest reusable prefix of `tokens` in namespace `salt` and plan the
        checkpoints.

        `boundaries` are message ends inside the input (token offsets), for admission
        policies that use them. Advances the clock, counts the lookup in `stats`, touches
        what the eviction policy says a hit touches (use `peek` for none of that). A model
        without SSM layers (a Transformer) reuses every matched token, KV being sliceable:
        its hit is the matched length and `node` the deepest node matched in full.
        """
        tok = self._tokens(tokens, "lookup")
        return self._lookup(tok.tobytes(), boundaries, check_salt(salt))

    def _lookup(self, key: bytes, boundaries: Sequence[int], salt: Salt) -> Plan:
        self.clock += 1
        plan, match = self._plan(key, boundaries, salt, learn=True)
        self.eviction.on_lookup(match.path, plan.node, self.clock)
        self.stats.record_lookup(plan.n_input, plan.hit)
        return plan

    def peek(self, tokens: object, *, boundaries: Sequence[int] = (),
             salt: Salt = None) -> Plan:
        """The plan `lookup` would return now, with no side effect: the clock, recency,
        statistics and policies' books are left as they were (a scheduler's probe)."""
        tok = self._tokens(tokens, "peek")
        return self._plan(tok.tobytes(), boundaries, check_salt(salt), learn=False)[0]

    def _plan(self, key: bytes, boundaries: Sequence[int], salt: Salt, *,
              learn: bool) -> tuple[Plan, Match]:
        n = len(key) // TOKEN_BYTES
        match = self.tree.match(key, salt)
        if learn:
            self._looked = (key, salt, match, self.tree.version)
        limit = self.admission.max_hit(n)
        if self.spec.ssm_layers == 0:
            node, hit = match.node, min(match.length, limit)
        else:
            node = _deepest_state(match, limit)
            hit = node.depth if node is not None else 0
        ask = self.admission.checkpoints_at if learn else self.admission.preview
        checkpoints = ask(match, n, hit, boundaries, key)
        return Plan(hit, node, checkpoints, match.length, n), match

    def required_states(self, tokens: object, n_input: int, *, boundaries: Sequence[int] = (),
                        salt: Salt = None) -> tuple[int, ...]:
        """Positions whose state `commit(tokens, n_input, salt=salt)` would admit, so that
        the engine captures them (no side effects)."""
        tok = self._tokens(tokens, "required_states")
        key = tok.tobytes()
        match = self.tree.match(key, check_salt(salt))
        held = {n.depth for n in match.path if n.has_state}
        positions = self.admission.positions_at(match, len(tok), n_input, boundaries, key)
        return tuple(p for p in positions if p not in held)

    # --- commit --------------------------------------------------------------------

    def commit(self, tokens: object, n_input: int, states: Mapping[int, Handle] | None = None,
               kv: Handle = None, *, boundaries: Sequence[int] = (),
               salt: Salt = None) -> CommitResult:
        """Insert input + output into namespace `salt`, admitting states where the
        admission policy says.

        Evicts first so that bytes never exceed capacity afterwards; if the sequence
        cannot fit even then, nothing is inserted (`refused`). `states` maps positions
        to captured handles (None: all captured); the cache owns them from here on and
        releases the ones it does not keep through the store. `kv` is read (`kv_slice`)
        during the call only. `boundaries`: as in `lookup`.
        """
        tok = self._tokens(tokens, "commit")
        if not 0 <= n_input <= len(tok):
            raise ValueError(f"commit: n_input={n_input!r} outside [0, {len(tok)}]")
        return self._commit(tok.tobytes(), n_input, states, kv, boundaries, check_salt(salt))

    def serve(self, key: bytes, n_input: int, boundaries: Sequence[int] = ()) -> int:
        """One request of a token-only replay, from its tokens (input + output) as checked
        int32 bytes, `as_tokens(tokens).tobytes()`: `lookup` of the input, then `commit`
        of the whole, in the default namespace, with no states or KV handed over (every
        checkpoint counts as captured). Returns the hit. What a replay that feeds one
        request to many caches calls (marconi+'s shadows), converting and checking the
        tokens once instead of twice per cache."""
        n = len(key) // TOKEN_BYTES
        if len(key) % TOKEN_BYTES or not 0 < n_input <= n:
            raise ValueError(f"serve: n_input={n_input!r} outside [1, {n}] (or the key is "
                             f"not int32 bytes: {len(key)} bytes)")
        hit = self._lookup(key[: n_input * TOKEN_BYTES], boundaries, None).hit
        self._commit(key, n_input, None, None, boundaries, None)
        return hit

    def serve_tokens(self, tokens: object, n_input: int,
                     boundaries: Sequence[int] = ()) -> int:
        """`serve` from the request's tokens (input + output) as any `as_tokens` takes
        them, checked here: the simulator's step (a compiled cache reads an int32 array in
        place)."""
        return self.serve(as_tokens(tokens, what="serve: tokens").tobytes(), n_input,
                          boundaries)

    def serve_many(self, tokens: Sequence[object], n_input: np.ndarray,
                   boundaries: Sequence[Sequence[int]]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`serve_tokens` for each request in turn: each one's hit, and the cache's KV and
        state bytes after it (what a replay records per request), as int64 arrays. The
        simulator's step once nothing else needs to see each request (no tuner left to
        feed, no bounds, no callback); the compiled core runs the loop itself."""
        m = len(tokens)
        hits, kv, ssm = (np.empty(m, dtype=np.int64) for _ in range(3))
        for j in range(m):
            hits[j] = self.serve_tokens(tokens[j], int(n_input[j]), boundaries[j])
            kv[j], ssm[j] = self.stats.kv_bytes, self.stats.ssm_bytes
        return hits, kv, ssm

    def _commit(self, key: bytes, n_input: int, states: Mapping[int, Handle] | None,
                kv: Handle, boundaries: Sequence[int], salt: Salt) -> CommitResult:
        self.clock += 1
        self.stats.commits += 1
        n = len(key) // TOKEN_BYTES
        if not self.admission.caches:
            key = b""
        looked = self._looked
        match = self.tree.match(key, salt, after=looked[2] if (
            looked is not None and looked[3] == self.tree.version and looked[1] == salt
            and key.startswith(looked[0])) else None)
        positions = self.admission.positions_at(match, n, n_input, boundaries, key)
        kept = self.admission.kept(positions, n) if key else n
        if kept < n:  # e.g. up to its last state, or its last full block
            key = key[: kept * TOKEN_BYTES]
            match = self.tree.match(key, salt)
            positions = tuple(p for p in positions if p <= kept)
        if not key:  # nothing to keep: vanilla, or no state to end on
            self._release_unused(states, set())
            return CommitResult((), None, refused=False)
        wanted = self._wanted(match, positions, states)
        tokens, working = self.admission.running(n)  # held while it ran, room made for it
        if not self._make_room(match, max(len(key) // TOKEN_BYTES, tokens), len(wanted) + working):
            self._release_unused(states, set())
            self.stats.refused_commits += 1
            self.eviction.on_commit(match.path, (), self.clock)
            return CommitResult((), None, refused=True)
        result, path = self._insert(key, match, wanted, kv, self.tree.namespace(salt))
        assert result.node is not None
        self._grow_in_place(result.node, path)
        self._collect_garbage(set())
        self._release_unused(states, set(result.admitted))
        return result

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


def _deepest_state(match: Match, limit: int) -> Node | None:
    """Deepest matched node holding a state within the first `limit` tokens."""
    for node in reversed(match.path):
        if node.has_state and node.depth <= limit:
            return node
    return None

