"""The compiled core: a C++ twin of `PrefixCache` for token-only replays, with the Python
core as its oracle (docs/architecture.md, "The compiled core").

`replay_cache` is the seam. Given the policies a system runs, it returns a
`CompiledCache` when the compiled core can run them exactly, else a `PrefixCache`:

```
cache = replay_cache(spec, "2GB", Judicious(), LRULeaf(), name="sglang+")   # compiled
cache.lookup(tokens); cache.commit(tokens, n_input); cache.stats; cache.serve(key, n)
```
What runs compiled (`compiled_reason` says why anything else does not): the policies
whose class declares `compiled_as`, a declared placement (the paper's judicious, vLLM+'s
block admission, none), marconi+'s structured admission (its boundaries or planner's
points handed over per request), sparse prefix caching's (its placement's points, the
same way), with a declared priority of up to two keys (LRU over leaves among them), a declared
score over the features `compiled_forms.score_form` maps (Marconi's FLOP-aware eviction
with the paper's recency or the artifact's, SegLen: the replay length in place of the
efficiency), GreedyDual-FLOP, hit density (by depth too), marconi+'s
live eviction (all of these but FLOP-aware at once, `Switchable`), or none at all (the
same-system bound, which never evicts); one byte budget with KV per token; vLLM's align
mode (`peers.mamba_align.Align`) with its block queue (`BlockLRU`, or `BlockFlop`:
Marconi's order for its states), KV in pages or per token; and SGLang's admission
(`peers.mamba_radix.MambaRadix`, either buffer mode) with its two lists (`MambaRadixLRU`,
`MambaRadixFlop`, or `TailLRU`: T-LRU's KV order; no cap on states per path), a state pool
beside the KV or not; pins
(`CompiledCache.pin` of a node a lookup or commit returned, as `PrefixCache.pin`). No
engine handles, no eviction callback, the default namespace. That is vanilla,
vllm+, sglang+ and marconi (its bootstrap tuner's replays too), marconi-inverse-age,
seglen, sparse-prefix, tlru, their bounds and concurrent replays, marconi+ (its
live cache and its shadow experts), the engines' emulations (`vllm-2026`, `sglang-2026`,
`sglang-2026-extra` and their `+marconi`), and so the mirrors and replays of marconi's
integrations (`integrations.choosers`). llamacpp-2026 (a namespace per session), and
every engine-facing cache (handles), runs the Python core.
Sparse prefix caching's placement (`place`), the sequences an overlap distribution has
seen (`SequenceTree`) and its books of depths (`DepthBooks`) run on it too
(`core.compiled_overlaps`, re-exported here).

`MARCONI_CORE=python|compiled` chooses (default: compiled where it is built). Where the
extension was not built (no C++ compiler when marconi was installed), the Python core
runs and one line on stderr says so; `MARCONI_CORE=compiled` then fails.
"""

from __future__ import annotations

import builtins
import copy
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from marconi.core.books import CoreBooks as CoreBooks
from marconi.core.cache import CommitResult, Plan, PrefixCache
from marconi.core.compiled_forms import ADMISSIONS as ADMISSIONS  # (re-exported)
from marconi.core.compiled_forms import BLOCK_QUEUES as BLOCK_QUEUES
from marconi.core.compiled_forms import ENGINE_PAIRS as ENGINE_PAIRS
from marconi.core.compiled_forms import EVICTIONS as EVICTIONS
from marconi.core.compiled_forms import RADIX_LISTS as RADIX_LISTS
from marconi.core.compiled_forms import compiled_as as compiled_as
from marconi.core.compiled_forms import compiled_reason as compiled_reason
from marconi.core.compiled_forms import score_form as score_form
from marconi.core.compiled_overlaps import DepthBooks as DepthBooks  # (re-exported)
from marconi.core.compiled_overlaps import SequenceTree as SequenceTree  # (re-exported)
from marconi.core.compiled_overlaps import place as place  # (re-exported)
from marconi.core.layout import Layout
from marconi.core.policy import Admission, Eviction
from marconi.core.priority import ListVictim, terms
from marconi.core.snapshot import Snapshot
from marconi.core.spec import ModelSpec
from marconi.core.stats import CacheStats
from marconi.core.tokens import as_tokens
from marconi.core.tree import TOKEN_BYTES, Salt
from marconi.core.units import parse_size

CORE_ENV = "MARCONI_CORE"
CORES = ("python", "compiled")
try:
    from marconi.core import _native  # type: ignore[attr-defined]
except ImportError as err:  # not built: the Python core runs
    _native = None
    _MISSING = str(err)
else:
    _MISSING = ""

_told = False


def native_seen_tree() -> Any:
    """A fresh `SeenTree` of the compiled core (`sim.bounds.CompiledSeenTree` wraps it)."""
    if _native is None:
        raise RuntimeError("the compiled core is not built")
    return _native.SeenTree()


def built() -> bool:
    """Whether the compiled core was built when marconi was installed."""
    return _native is not None


def chosen() -> str:
    """The core `MARCONI_CORE` asks for: "python" or "compiled" (unset: compiled where
    it is built). ValueError for another value, or for "compiled" where it is not built."""
    value = os.environ.get(CORE_ENV, "").strip().lower()
    if value and value not in CORES:
        raise ValueError(f"{CORE_ENV}={os.environ[CORE_ENV]!r}: expected one of "
                         f"{', '.join(CORES)}")
    if value == "compiled" and _native is None:
        raise ValueError(f"{CORE_ENV}=compiled, but the compiled core is not built "
                         f"({_MISSING}); reinstall marconi where a C++ compiler is found")
    if not value:
        return "compiled" if _native is not None else "python"
    return value


def _tell_missing() -> None:
    global _told
    if not _told:
        _told = True
        print("marconi: the compiled core is not built (no C++ compiler at install?); "
              "running the Python core", file=sys.stderr)


def replay_cache(spec: ModelSpec, capacity: int | str, admission: Admission,
                 eviction: Eviction, *, name: str = "custom",
                 layout: Layout | None = None) -> PrefixCache:
    """A fresh token-only cache running these policies: compiled where the compiled core
    runs them and `MARCONI_CORE` allows, else a `PrefixCache` (the oracle).

    A `CompiledCache` is typed as the `PrefixCache` it stands in for: it has the surface
    a token-only driver uses (the simulator, the tuners' replays: `lookup`, `peek`,
    `commit`, `serve`, `stats`, `alpha`, `eviction.alpha`, snapshots, pins) and refuses
    the rest (handles, namespaces) with an error, never silently."""
    layout = layout or Layout()
    core = chosen()
    if core == "compiled" and compiled_reason(spec, admission, eviction, layout) is None:
        return cast(PrefixCache, CompiledCache(spec, capacity, admission, eviction, name=name,
                                               layout=layout))
    if core == "python" and _native is None and not os.environ.get(CORE_ENV):
        _tell_missing()
    return PrefixCache(spec, capacity, admission, eviction, name=name,
                       page_size=layout.page_size, state_slots=layout.state_slots)


class _Eviction:
    """What a driver reads of a compiled cache's eviction: its alpha, and the Python
    policy it runs (its `fresh` for a tuner's replays)."""

    def __init__(self, policy: Eviction, core: Any) -> None:
        self.policy = policy
        self._core = core

    @property
    def alpha(self) -> float | None:
        return self._core.alpha if self.policy.alpha is not None else None

    def set_alpha(self, alpha: float) -> None:
        self.policy.set_alpha(alpha)  # checks it
        self._core.set_alpha(float(alpha))

    def fresh(self, alpha: float) -> Eviction:
        return self.policy.fresh(alpha)

    # marconi+'s live cache (`Switchable`): its setting, switched in the core too, and the
    # fresh policies its shadows run
    def set_setting(self, setting: Any) -> None:
        policy: Any = self.policy
        policy.set_setting(setting)  # checks it
        self._core.set_run(policy.run)

    @property
    def setting(self) -> Any:
        return self.policy.setting  # type: ignore[attr-defined]

    @property
    def mode(self) -> Any:
        return self.policy.mode  # type: ignore[attr-defined]

    def solo(self, mode: Any, alpha: float = 0.0) -> Eviction:
        return self.policy.solo(mode, alpha)  # type: ignore[attr-defined]


class _Stats:
    """`CacheStats` read live from the compiled core: the byte counts the simulator reads
    per request directly, every other counter through a `CacheStats` copy."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def __getattr__(self, name: str) -> int:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._core.stats(), name)

    @property
    def kv_bytes(self) -> int:
        return self._core.kv_bytes

    @property
    def ssm_bytes(self) -> int:
        return self._core.ssm_bytes

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.ssm_bytes

    def copy(self) -> CacheStats:
        return self._core.stats()

    def as_dict(self) -> dict[str, int]:
        return self.copy().as_dict()


@dataclass(frozen=True, slots=True)
class CompiledNode:
    """A node of a `CompiledCache` as a lookup's plan or a commit's result names it (the
    `Node` of the Python core): its slot in the core's arrays, its uid (a slot freed and
    taken again holds another uid) and its depth. What `pin` and `unpin` take."""

    slot: int
    uid: int
    depth: int


class CompiledCache:
    """A token-only `PrefixCache` on the compiled core: the same lookups, commits,
    counters, snapshots and pins, no handles, the default namespace only."""

    compiled = True

    def __init__(self, spec: ModelSpec, capacity: int | str, admission: Admission,
                 eviction: Eviction, *, name: str = "custom",
                 layout: Layout | None = None) -> None:
        if _native is None:
            raise ValueError(f"the compiled core is not built ({_MISSING})")
        self.layout = layout or Layout()
        reason = compiled_reason(spec, admission, eviction, self.layout)
        if reason is not None:
            raise ValueError(f"the compiled core cannot run this cache: {reason}")
        self.spec = spec
        self.capacity = parse_size(capacity)
        self.name = name
        self.admission = admission.for_model(spec)
        kind = compiled_as(admission)
        # structured admission and sparse prefix caching's: placed in the core (their
        # declared placement, or none), with the positions their Python side works out per
        # request (`extra_positions`) handed over first
        self._structured = kind in ("structured", "sparse")
        books = eviction.core_books()
        self._core = _native.NativeCore(
            _sizes(spec), self.capacity, "placed" if self._structured else kind,
            compiled_as(eviction), float(eviction.alpha or 0.0))
        placement = self.admission.placement
        if placement is not None:  # a declared placement (`core.placement.Placed`)
            self._core.set_placement(placement.branch, placement.every, placement.end)
        if kind == "align":  # vLLM's align mode (`peers.mamba_align.Align`)
            config = self.admission.config  # type: ignore[attr-defined]
            self._core.set_align(self.admission.block, config.chunk,  # type: ignore[attr-defined]
                                 config.retention, config.junctions)
        if kind == "radix":  # SGLang's (`peers.mamba_radix.MambaRadix`) and its pools
            config = self.admission.config  # type: ignore[attr-defined]
            self._core.set_radix(config.mode.value == "extra-buffer", config.chunk,
                                 config.track, config.decode_interval)
            assert books.state_share is not None  # (SGLang's lists hand their share)
            self._core.set_pool(self.layout.state_slots,
                                self.layout.kv_capacity(spec, self.capacity),
                                float(books.state_share))
        if self.layout.page_size > 1:
            self._core.set_pages(self.layout.page_size)
        self._hand(books)
        self.eviction = _Eviction(eviction, self._core)
        self.stats = _Stats(self._core)

    def _hand(self, books: CoreBooks) -> None:
        """Hand the core the eviction's declaration and books (`CoreBooks`), each to its
        setter, whichever eviction it is."""
        if books.keys is not None:  # a declared priority (`core.priority`)
            self._core.set_keys(*terms(books.keys))
        if books.score is not None:  # a declared score (`core.priority.Score`)
            form = score_form(books.score, ranked=False)
            assert not isinstance(form, str)  # (`compiled_reason` refused it otherwise)
            self._core.set_score_terms(*form)
            self._core.set_level(float(books.level))  # (a leveled score's; else unread)
        if books.lists is not None:  # an engine's two lists (`core.priority.Lists`)
            lists, safe = books.lists, books.lists.tail_safe
            self._core.set_lists(lists.victim is ListVictim.SHORT_POOL, lists.shallow_first,
                                 lists.garbage, safe is not None,
                                 *((safe.threshold, safe.next_prompt) if safe else (0, 0)))
        if books.state_score is not None:  # a declared score over an engine's state list
            declared = books.state_score
            form = score_form(declared.score, ranked=True)
            assert not isinstance(form, str)  # (`compiled_reason` refused it otherwise)
            self._core.set_state_score(_sizes(declared.spec), *form, declared.from_parent,
                                       declared.branches_last)
        for k, density in enumerate(books.densities):
            # (bucket and class bounds, tables, constants: `HitDensity.compiled_books`)
            self._core.set_density(k, *density)
        for k, score in enumerate(books.learned):  # marconi+'s learned experts' scores
            form = score_form(score, ranked=False)
            assert not isinstance(form, str)  # (`compiled_reason` refused it otherwise)
            self._core.set_learned_terms(k, *form)
        if books.run is not None:  # marconi+'s live cache: the expert choosing
            self._core.set_run(books.run)

    def _place(self, key: builtins.bytes, n_input: int, boundaries: Sequence[int],
               phase: str) -> None:
        """Hand the admission's positions for this request to the core (`phase`: "peek",
        "lookup", "commit" or "serve", which is a lookup and its commit; an admission
        that learns from what is committed learns there)."""
        if self._structured:
            self._core.set_positions(*self.admission.extra_positions(  # type: ignore[attr-defined]
                key, n_input, boundaries, phase))

    def clone(self, shared: Sequence[object] = ()) -> CompiledCache:
        """`snapshot.clone`: an independent copy that behaves from here on as this one
        would (the core's tree, books and counters copied; the Python policies deep-copied,
        the objects in `shared` referred to, not copied)."""
        memo: dict[int, object] = {id(self.spec): self.spec, **{id(o): o for o in shared}}
        out = copy.copy(self)
        out._core = self._core.copy()
        out.admission = copy.deepcopy(self.admission, memo)
        out.eviction = _Eviction(copy.deepcopy(self.eviction.policy, memo), out._core)
        out.stats = _Stats(out._core)
        return out

    def lookup(self, tokens: object, *, boundaries: Sequence[int] = (),
               salt: Salt = None) -> Plan:
        key = self._key(tokens, "lookup", salt)
        self._place(key, len(key) // TOKEN_BYTES, boundaries, "lookup")
        hit, matched, checkpoints, slot = self._core.lookup(key)
        return Plan(hit, self._node(slot), checkpoints, matched, len(key) // TOKEN_BYTES)

    def peek(self, tokens: object, *, boundaries: Sequence[int] = (),
             salt: Salt = None) -> Plan:
        key = self._key(tokens, "peek", salt)
        self._place(key, len(key) // TOKEN_BYTES, boundaries, "peek")
        hit, matched, checkpoints, slot = self._core.peek(key)
        return Plan(hit, self._node(slot), checkpoints, matched, len(key) // TOKEN_BYTES)

    def commit(self, tokens: object, n_input: int, states: None = None, kv: None = None, *,
               boundaries: Sequence[int] = (), salt: Salt = None) -> CommitResult:
        if states is not None or kv is not None:
            raise ValueError("commit: the compiled core keeps no handles (states, kv)")
        key = self._key(tokens, "commit", salt)
        n = len(key) // TOKEN_BYTES
        if not 0 <= n_input <= n:
            raise ValueError(f"commit: n_input={n_input!r} outside [0, {n}]")
        self._place(key, n_input, boundaries, "commit")
        refused, admitted, end = self._core.commit(key, n_input)
        return CommitResult(admitted, self._node(end), refused=refused)

    def serve(self, key: bytes, n_input: int, boundaries: Sequence[int] = ()) -> int:
        """`PrefixCache.serve`: lookup of the input, commit of the whole (checked bytes)."""
        n = len(key) // TOKEN_BYTES
        if len(key) % TOKEN_BYTES or not 0 < n_input <= n:
            raise ValueError(f"serve: n_input={n_input!r} outside [1, {n}] (or the key is "
                             f"not int32 bytes: {len(key)} bytes)")
        self._place(key, n_input, boundaries, "serve")
        return self._core.serve(key, n_input)

    def serve_tokens(self, tokens: object, n_input: int,
                     boundaries: Sequence[int] = ()) -> int:
        """`PrefixCache.serve_tokens`: an int32 array is read in place, its ids checked by
        the compiled core as it reads them (the simulator's step)."""
        if type(tokens) is np.ndarray and tokens.dtype == np.int32 and tokens.ndim == 1 \
                and tokens.flags.c_contiguous and not self._structured:
            hit = self._core.serve_array(tokens, n_input)
            if hit is not None:
                return hit
        return self.serve(as_tokens(tokens, what="serve: tokens").tobytes(), n_input,
                          boundaries)

    def serve_many(self, tokens: Sequence[object], n_input: np.ndarray,
                   boundaries: Sequence[Sequence[int]]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`PrefixCache.serve_many`: the requests' loop runs in the compiled core; one it
        cannot take as it is goes through `serve_tokens` (its conversion, its error)."""
        m = len(tokens)
        hits, kv, ssm = (np.empty(m, dtype=np.int64) for _ in range(3))
        arrays = tokens if isinstance(tokens, list) else list(tokens)
        needs = np.ascontiguousarray(n_input, dtype=np.int64)
        # structured admission needs each request's positions: one request at a time
        j = m if self._structured else self._core.serve_arrays(arrays, needs, hits, kv, ssm, 0)
        if self._structured:
            for k in range(m):
                hits[k] = self.serve_tokens(arrays[k], int(needs[k]), boundaries[k])
                kv[k], ssm[k] = self._core.kv_bytes, self._core.ssm_bytes
        while j < m:
            hits[j] = self.serve_tokens(arrays[j], int(needs[j]), boundaries[j])
            kv[j], ssm[j] = self._core.kv_bytes, self._core.ssm_bytes
            j = self._core.serve_arrays(arrays, needs, hits, kv, ssm, j + 1)
        return hits, kv, ssm

    def _node(self, slot: int) -> Any:
        """The node in `slot` as callers hold it (-1: None); typed as the `Node` it
        stands in for."""
        if slot < 0:
            return None
        return CompiledNode(slot, self._core.uid(slot), self._core.depth(slot))

    def pin(self, node: object) -> None:
        """`PrefixCache.pin`: protect `node` (from this cache's lookup or commit, or a
        clone's) and its ancestors from eviction until `unpin`. None: no-op."""
        if node is not None:
            self._core.pin(self._slot(node, "pin"))

    def unpin(self, node: object) -> None:
        """Undo one `pin(node)` (ValueError, nothing changed, if it is not pinned)."""
        if node is not None:
            slot = self._slot(node, "unpin")
            try:
                self._core.unpin(slot)
            except ValueError:
                raise ValueError(f"unpin of {node!r}, which is not pinned") from None

    def _slot(self, node: object, where: str) -> int:
        if not isinstance(node, CompiledNode):
            raise ValueError(f"{where}: {node!r} is not a node of a compiled cache (a "
                             f"lookup's plan.node or a commit's result.node)")
        if not self._core.holds(node.slot, node.uid):
            raise ValueError(f"{where}: {node!r} is no longer in the cache (evicted, or "
                             f"merged into its child, before it was pinned)")
        return node.slot

    def reserve(self, kv: int, states: int = 0) -> bool:
        """`Evicting.reserve`: hold `kv` bytes and `states` states beside the tree."""
        return bool(self._core.reserve(int(kv), int(states)))

    def release(self, kv: int, states: int = 0) -> None:
        """`Evicting.release`: give back what `reserve` held."""
        self._core.release(int(kv), int(states))

    @property
    def reserved(self) -> tuple[int, int]:
        """(KV bytes, states) held beside the tree by `reserve`."""
        kv, states = self._core.reserved
        return int(kv), int(states)

    @property
    def alpha(self) -> float:
        return self._core.alpha

    @property
    def clock(self) -> int:
        return self._core.clock

    @property
    def bytes(self) -> int:
        return self.stats.bytes

    def check(self) -> None:
        """Assert the compiled books (tests)."""
        self._core.check()

    def take(self) -> Snapshot:
        """`snapshot.take`: the tree in the Python core's walk order, with its stamps."""
        parents, keys, states, stamps = self._core.take()
        return Snapshot(spec=self.spec, capacity=self.capacity, clock=self.clock,
                        parents=tuple(parents), keys=tuple(keys), has_state=tuple(states),
                        stamps=tuple(stamps), layout=self.layout,
                        copies=tuple(self._core.copies()), salts=(None,) * len(keys))

    def load(self, snapshot: Snapshot) -> None:
        """`snapshot.rebuild` into this empty cache."""
        if snapshot.layout != self.layout or any(
                salt is not None for salt in snapshot.salts):
            raise ValueError(f"the compiled core loads snapshots of its own layout "
                             f"({self.layout.describe()}) and the default namespace only")
        self._core.load(snapshot.parents, snapshot.keys, snapshot.has_state, snapshot.stamps,
                        snapshot.clock, snapshot.copies)

    def freed(self) -> list[tuple[str, int, int]]:
        """Evictions since the last call, (action, depth, bytes freed), once
        `log_evictions()` is on (tests compare them with the Python core's `on_evict`)."""
        return self._core.drain_freed()

    def candidates(self) -> list[tuple[int, float, float]]:
        """FLOP-aware eviction's candidates in row order: (depth, last touch, FLOP
        efficiency); empty under LRU (tests compare them with the Python policy's)."""
        return self._core.candidates()

    def scores(self) -> list[float]:
        """FLOP-aware eviction's score of each candidate at this clock, in row order (its
        recency and its other term: the FLOP efficiency, or SegLen's replay length; tests
        compare them with the Python policy's `scores`)."""
        return self._core.flop_scores()

    def state_ranks(self) -> list[tuple[int, float, float]]:
        """`BlockFlop`'s states, least recently used first: (depth, stamp, efficiency)
        (tests compare them with the Python policy's `FlopStates.ranked`)."""
        return self._core.state_ranks()

    def log_evictions(self) -> None:
        self._core.log_evictions(True)

    def classes(self, k: int = 0) -> list[int]:
        """Hit density's class of each candidate, in row order (`k` 1: marconi+'s live
        cache's by depth; tests)."""
        return self._core.classes(k)

    def clock_stamps(self) -> list[float]:
        """marconi+'s live cache: each candidate's touch as hit density knows it (tests)."""
        return self._core.clock_stamps()

    @property
    def level(self) -> float:
        """GreedyDual-FLOP's inflation level (tests)."""
        return self._core.level

    def density_state(self, k: int = 0) -> tuple[list[float], list[float], list[float], int]:
        """Hit density's books: hits, events and density, row-major by class, and the
        events counted (`k` 1: marconi+'s live cache's by depth; tests)."""
        return self._core.density_state(k)

    @staticmethod
    def _key(tokens: object, where: str, salt: Salt) -> builtins.bytes:
        if salt is not None:
            raise ValueError(f"{where}: the compiled core has the default namespace only")
        tok = as_tokens(tokens, what=f"{where}: tokens")
        if tok.size == 0:
            raise ValueError(f"{where}: empty token list")
        return tok.tobytes()


def _sizes(spec: ModelSpec) -> dict[str, int]:
    """What the compiled core reads of a model: its byte sizes and FLOP formula's terms."""
    return {"kv_per_token": spec.kv_bytes_per_token, "ssm_bytes": spec.ssm_bytes,
            "attention": spec.attention_layers, "mlp": spec.mlp_layers,
            "ssm": spec.ssm_layers, "d_model": spec.d_model, "d_state": spec.d_state}


def first_ages(bucket: Callable[[int], int], buckets: int) -> list[float]:
    """The first integer age of each of `buckets` buckets as `bucket` assigns them (a
    monotone map from ages to buckets, 0 to the first): the compiled core buckets an age by
    bisecting these, so that it lands where the Python function puts it, whatever rounding
    its logarithm does (inf: a bucket no age up to 2^62 reaches)."""
    out = [0.0]
    for b in range(1, buckets):
        lo, hi = int(out[-1]) if math.isfinite(out[-1]) else 1 << 62, 1 << 62
        if bucket(hi) < b:
            out.append(math.inf)
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if bucket(mid) >= b:
                hi = mid
            else:
                lo = mid + 1
        out.append(float(lo))
    return out
