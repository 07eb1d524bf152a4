"""Admission: which SSM checkpoints enter the cache (DESIGN section 3).

An admission policy answers two questions from a `Match` of the tree:

- `checkpoints`: before prefill, which positions of the input the engine must capture
  a state at (they lie after the hit: the prefix before it is restored, not computed);
- `positions`: at commit, which positions of input + output become nodes holding a
  state (the cache keeps a state only where the engine captured one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from marconi.spec import ModelSpec
from marconi.tree import Match


class Admission(ABC):
    """Decides where SSM checkpoints are taken. Stateless: one instance per cache."""

    caches = True  # False: the system caches nothing at all (vanilla)
    truncates = False  # True: commit keeps a sequence only up to its last admitted state

    def for_model(self, spec: ModelSpec) -> Admission:
        """This policy adapted to `spec` (sizes derived from the model); default: itself."""
        return self

    def max_hit(self, n_input: int) -> int:
        """Longest hit a lookup of `n_input` tokens may return (some engines keep one
        token to compute, so the hit is capped below the input length)."""
        return n_input

    @abstractmethod
    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        """Positions in (hit, n_input] to capture during prefill, ascending."""

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        """`checkpoints`, told the input's message boundaries and token bytes (policies
        that use structure override this; default: ignore them)."""
        return self.checkpoints(match, n_input, hit)

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        """`positions`, told the input's message boundaries and token bytes."""
        return self.positions(match, n_total, n_input)

    @abstractmethod
    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        """Positions in (0, n_total] that get a node with a state at commit, ascending."""


def branch_point(match: Match, n_tokens: int) -> int | None:
    """Where a sequence of `n_tokens` leaves the tree at a new or stateless branch.

    ```
    tree:  |---- shared ----|-- old continuation --|
    input: |---- shared ----|-- new continuation ------|
                            ^ branch point (inserting the input splits the edge here)
    ```
    A sequence that ends inside an edge, or follows the tree to its end, branches nowhere.
    """
    if match.length >= n_tokens:
        return None
    if match.partial is not None:
        return match.length  # leaves mid-edge: the insertion creates this node
    node = match.node
    if node is not None and not node.has_state and node.children:
        return match.length  # an existing branch node that lost (or never had) its state
    return None


class Judicious(Admission):
    """Marconi / SGLang+: a state at a new branch point and at the end of each request.

    The branch point comes from a speculative insertion of the input before prefill; a
    branch inside the output (the output leaves an existing edge) is admitted at commit
    too, as the paper's artifact does.
    """

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        p = branch_point(match, n_input)
        return (p,) if p is not None and p > hit else ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        p = branch_point(match, n_total)
        return (p, n_total) if p is not None else (n_total,)


class Block(Admission):
    """vLLM+: a state at every `block`-token boundary, each block a node; the final
    partial block of a sequence is kept as a node with a state too (as in the paper)."""

    def __init__(self, block: int = 32) -> None:
        if not isinstance(block, int) or block <= 0:
            raise ValueError(f"block size must be a positive integer, got {block!r}")
        self.block = block

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        first = (hit // self.block + 1) * self.block
        return tuple(range(first, n_input + 1, self.block))

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        aligned = list(range(self.block, n_total + 1, self.block))
        if not aligned or aligned[-1] != n_total:
            aligned.append(n_total)
        return tuple(aligned)


class NoAdmission(Admission):
    """Vanilla: nothing is cached."""

    caches = False

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        return ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        return ()
