"""The two policy protocols a `PrefixCache` runs, and the values they exchange with it.

An admission policy answers, from a `Match` of the tree, where SSM checkpoints are taken:

- `checkpoints`: before prefill, which positions of the input the engine must capture a
  state at (they lie after the hit: the prefix before it is restored, not computed);
- `positions`: at commit, which positions of input + output become nodes holding a
  state (the cache keeps a state only where the engine captured one).

An eviction policy keeps its own bookkeeping (stamps, candidate sets), is told about every
change the cache makes to the tree, and chooses victims. Choosing a victim (`victim`) is
separate from evicting it: the cache does that (`marconi.core.evicting`), then reports the
changes back. Families of policies live in `marconi.paper`, `marconi.peers` and
`marconi.plus`; docs/architecture.md shows how to add one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from marconi.core.books import CoreBooks
from marconi.core.priority import Placement
from marconi.core.spec import ModelSpec
from marconi.core.tree import Match, Node


class Admission(ABC):
    """Decides where SSM checkpoints are taken. One instance per cache."""

    caches = True  # False: the system caches nothing at all (vanilla)
    # where it places states, declared (`core.placement.Placed`, which every core
    # evaluates); None: placed by its own code
    placement: Placement | None = None
    # True: a namespace per session (a server slot of its own): a driver that knows each
    # request's session passes it as `salt` (the simulator); one that does not runs every
    # request in the default namespace
    per_session = False
    truncates = False  # True: commit keeps a sequence only up to its last admitted state

    def for_model(self, spec: ModelSpec) -> Admission:
        """This policy adapted to `spec` (sizes derived from the model); default: itself."""
        return self

    def max_hit(self, n_input: int) -> int:
        """Longest hit a lookup of `n_input` tokens may return (some engines keep one
        token to compute, so the hit is capped below the input length)."""
        return n_input

    def kept(self, positions: Sequence[int], n_total: int) -> int:
        """How many of a committed sequence's `n_total` tokens the cache keeps, given the
        positions it admits states at: all, or up to the last state (`truncates`)."""
        return max(positions, default=0) if self.truncates else n_total

    def running(self, n_total: int) -> tuple[int, int]:
        """What an engine holds while the request of `n_total` tokens runs, beyond what
        its commit keeps: (tokens whose KV it holds, working states). A commit makes room
        for that much, and keeps only what it admits; default (0, 0): nothing more."""
        return 0, 0

    @abstractmethod
    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        """Positions in (hit, n_input] to capture during prefill, ascending."""

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        """`checkpoints`, told the input's message boundaries and token bytes (policies
        that use structure override this; default: ignore them)."""
        return self.checkpoints(match, n_input, hit)

    def preview(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                tokens: bytes = b"") -> tuple[int, ...]:
        """`checkpoints_at` without learning from the call (`PrefixCache.peek`): a policy
        whose `checkpoints_at` updates its own books overrides this; default: the same."""
        return self.checkpoints_at(match, n_input, hit, boundaries, tokens)

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        """`positions`, told the input's message boundaries and token bytes."""
        return self.positions(match, n_total, n_input)

    @abstractmethod
    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        """Positions in (0, n_total] that get a node with a state at commit, ascending."""

    def superseded(self, path: Sequence[Node], n_total: int) -> tuple[Node, ...]:
        """Nodes on a committed sequence's `path` whose state the sequence replaced (a
        partial block that grew); the cache drops each one that has a single child by
        merging it into that child. Default: none."""
        return ()


class Action(Enum):
    REMOVE = "remove"  # a leaf: free its KV and state, detach it
    MERGE = "merge"  # one child: free its state, its edge's KV moves into the child
    DROP_STATE = "drop-state"  # free the state only; the node stays with its KV


@dataclass(frozen=True, slots=True)
class Victim:
    node: Node
    action: Action


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """Bytes held and bytes a pending insert needs, told to the policy before each victim
    choice (policies with separate KV and state budgets pick the list to evict from)."""

    kv_held: int
    ssm_held: int
    kv_need: int = 0
    ssm_need: int = 0
    capacity: int  # the budget KV counts against (states too when `ssm_capacity` is None)
    ssm_capacity: int | None = None  # a state-slot pool's bytes; None: one byte budget


def check_alpha(alpha: float) -> float:
    """`alpha` as a float, or ValueError unless it is a finite number >= 0."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) \
            or not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


def overrides(policy: Eviction, hook: str) -> bool:
    """Whether `policy`'s class replaces `Eviction`'s default `hook` (the cache skips the
    call of a hook left at its default, which does nothing)."""
    return getattr(type(policy), hook) is not getattr(Eviction, hook)


def alive(node: Node) -> bool:
    """Still in the tree (evicted and merged-away nodes lose their parent)."""
    return node.parent is not None


class Eviction(ABC):
    """Base: last-access stamps per node, event hooks, victim choice."""

    alpha: float | None = None  # the weight of FLOP efficiency, for policies that have one

    def __init__(self) -> None:
        self.stamp: dict[Node, float] = {}  # last access (clock ticks or a level)

    # --- events (the cache calls these) ------------------------------------------------

    @abstractmethod
    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        """A lookup matched `path` and will resume from `hit`."""

    @abstractmethod
    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        """A commit inserted a sequence along `path`, creating the nodes in `new`."""

    @abstractmethod
    def changed(self, node: Node) -> None:
        """`node`'s edge, state, children or pins changed."""

    def removed(self, node: Node) -> None:
        """`node` left the tree (evicted or merged away)."""
        self.stamp.pop(node, None)

    @abstractmethod
    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        """The next entry to evict, never a pinned or protected one; None if none."""

    def follow(self, now: int) -> None:
        """Told that another policy chooses the next victim in this one's place (a
        `Switchable` expert not running): a policy whose order depends on its own victims
        keeps up here; default: nothing."""
        return None

    def pressure(self, pressure: Pressure) -> None:
        """Told before each `victim` call during an eviction round (default: ignored)."""
        return None

    def garbage(self, protected: Collection[Node]) -> Victim | None:
        """An entry to evict now whatever the byte budget, never a pinned or protected one
        (e.g. a leaf left without state that no lookup can use); None: nothing."""
        return None

    def restore(self, stamps: dict[Node, float]) -> None:
        """Load stamps from a snapshot (nodes must already be in the tree)."""
        for node, t in stamps.items():
            self.stamp[node] = t
            self.changed(node)

    def set_alpha(self, alpha: float) -> None:
        """Change the weight of FLOP efficiency (a tuner does this); policies without
        one refuse."""
        raise ValueError(f"{type(self).__name__} has no alpha to set")

    def fresh(self, alpha: float) -> Eviction:
        """An empty policy like this one running `alpha` (the bootstrap tuner's replays);
        policies without an alpha refuse."""
        raise ValueError(f"{type(self).__name__} has no alpha to tune")

    def core_books(self) -> CoreBooks:
        """Its declarations and books, for the compiled core (`core.books`); default: none."""
        return CoreBooks()

    def check(self, nodes: Sequence[Node]) -> None:
        """Assert this policy's books agree with the tree's `nodes` (a full walk, for
        `marconi.core.integrity`); default: nothing to check."""
        return None
