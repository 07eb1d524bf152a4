"""The paper's admissions: judicious (Marconi, SGLang+), block (vLLM+), none (vanilla).

See docs/architecture.md ("Admission") for the rules they follow.
"""

from __future__ import annotations

from collections.abc import Sequence

from marconi.core.policy import Admission
from marconi.core.tree import Match, Node


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

    compiled_as = "judicious"  # the compiled core runs it (marconi.core.compiled)

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        p = branch_point(match, n_input)
        return (p,) if p is not None and p > hit else ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        p = branch_point(match, n_total)
        return (p, n_total) if p is not None else (n_total,)


class Block(Admission):
    """vLLM+: a state at every `block`-token boundary, each block a node; the final
    partial block of a sequence is kept as a node with a state too (as in the paper)."""

    compiled_as = "block"  # the compiled core runs it (marconi.core.compiled)

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

    def superseded(self, path: Sequence[Node], n_total: int) -> tuple[Node, ...]:
        """An earlier sequence's final partial block that this one extends: as in the
        paper's artifact, the block grows in place (its state moves to the block's new
        end) instead of staying behind as an interior node with a state.

        ```
        before:  | 32 | 64 | 96 |100|            states at 32, 64, 96, 100
        commit:  | 32 | 64 | 96 |100| 128 | 150  states at 128, 150 added
        after:   | 32 | 64 | 96 ---- 128 | 150  the partial block [96, 100) grew
        ```
        """
        return tuple(n for n in path if n.has_state and n.depth % self.block
                     and n.depth < n_total)


class NoAdmission(Admission):
    """Vanilla: nothing is cached."""

    caches = False
    compiled_as = "none"

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        return ()

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        return ()
