"""The paper's admissions: judicious (Marconi, SGLang+), block (vLLM+), none (vanilla),
each a `Placement` declared once here and evaluated by every core (`core.placement.Placed`
on the Python core, `Core::set_placement` on the compiled one).

See docs/architecture.md ("Admission") for the rules they follow.
"""

from __future__ import annotations

from marconi.core.placement import Placed
from marconi.core.placement import branch_point as branch_point  # (re-exported)
from marconi.core.priority import Placement

# Marconi / SGLang+: a state at a new branch point and at the end of each request
JUDICIOUS = Placement("judicious", branch=True, end=True,
                      description="the branch point and the end of each sequence")
# vanilla: nothing is cached
NOTHING = Placement("none", description="no state anywhere: nothing is cached")


def every_block(block: int) -> Placement:
    """vLLM+: a state at every `block`-token boundary, each block a node; the final
    partial block of a sequence is kept as a node with a state too (as in the paper)."""
    return Placement(f"block-{block}", every=block, end=True,
                     description=f"every {block} tokens and the end of each sequence")


class Judicious(Placed):
    """Marconi / SGLang+ (`JUDICIOUS`). The branch point comes from a speculative
    insertion of the input before prefill; a branch inside the output (the output leaves
    an existing edge) is admitted at commit too, as the paper's artifact does."""

    compiled_as = "placed"  # the compiled core evaluates its declaration

    def __init__(self) -> None:
        pass  # (its placement is the module's `JUDICIOUS`, read where it is used)

    @property
    def placement(self) -> Placement:  # type: ignore[override]
        return JUDICIOUS


class Block(Placed):
    """vLLM+ (`every_block(block)`): a state at every `block`-token boundary, each block a
    node, the final partial block growing in place as a later sequence extends it."""

    compiled_as = "placed"  # the compiled core evaluates its declaration

    def __init__(self, block: int = 32) -> None:
        if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
            raise ValueError(f"block size must be a positive integer, got {block!r}")
        super().__init__(every_block(block))
        self.block = block


class NoAdmission(Placed):
    """Vanilla (`NOTHING`): nothing is cached."""

    compiled_as = "placed"  # the compiled core evaluates its declaration

    def __init__(self) -> None:
        pass  # (its placement is the module's `NOTHING`)

    @property
    def placement(self) -> Placement:  # type: ignore[override]
        return NOTHING
