"""marconi+'s overlap planner: sparse prefix caching's checkpoint placement as something
an admission expert can add (`Boundaries.OVERLAP`, among marconi+'s experts).

Sparse prefix caching (`marconi.peers.sparse_prefix`) places at most `budget` states per
input at the depths that maximize the tokens a later request is expected to reuse, given
the overlap depths of the requests before it (the longest prefix of an input that an
earlier input or output spelled). This planner keeps that distribution for a marconi+
cache: one planner per live cache, shared by the cache's admission and by its shadows'
(the distribution depends on the request stream only, never on what a cache holds), and
taught every request by the shadow tuner after the live commit, whichever expert runs,
so a switch to the overlap expert starts warm.

```
request -> live cache: lookup + commit (points from the requests before it)
        -> tuner.observe: shadows serve it (the same points), then planner.learn(request)
```
Cost: the sequences seen are kept as a token radix tree (about 4 bytes per distinct
token), at most `memory` tokens of them (marconi+: `ShadowConfig.overlap_memory`, 2^24;
older ones are forgotten, `Overlaps`; `marconi+-overlap` keeps every one, for replays),
and each distinct overlap depth with its count; a plan walks the distinct depths up to
`CANDIDATES` of them, and past that finds the ones `thin` keeps by bisection, their
survival from the running counts (`thinned`; the depths' books on the compiled core where
it runs, `peers.sparse_prefix.depth_books`).
Where more than `CANDIDATES` distinct depths are up to the input's length (agent
trajectories: every step overlaps its predecessor at a new depth), the dynamic program
runs over the shallowest of each 1/`PER_DOUBLING` of a doubling (`thin`), not over all
of them (the program is `O(depths x budget)` in pure Python, once per input): a
checkpoint there is reused by every request overlapping deeper in its bucket, at most 4%
fewer tokens each.
"""

from __future__ import annotations

from collections.abc import Sequence

from marconi.core.tree import TOKEN_BYTES
from marconi.peers.sparse_prefix import Overlaps, place

CANDIDATES = 256  # distinct depths the dynamic program takes whole (sparse-prefix's plan)
PER_DOUBLING = 16  # beyond that, candidate depths per doubling (`thin`)


def thin(depths: Sequence[int], survival: Sequence[float], per_doubling: int = PER_DOUBLING
         ) -> tuple[list[int], list[float]]:
    """The candidates `place` runs over when there are too many: walking up the depths
    (ascending), each one at least 2^(1/per_doubling) times the last kept, with its
    survival (the shallowest of its bucket: it has the most requests at or beyond it)."""
    kept: list[int] = []
    share: list[float] = []
    step = 2.0 ** (1.0 / per_doubling)
    for depth, s in zip(depths, survival, strict=True):
        if not kept or depth >= kept[-1] * step:
            kept.append(depth)
            share.append(s)
    return kept, share


class OverlapPlanner(Overlaps):
    """Checkpoint positions for an input from the overlap depths of the requests learnt
    so far (`points`), and the learning (`learn`), once per request."""

    def __init__(self, budget: int = 4, memory: int | None = None) -> None:
        if budget < 1:
            raise ValueError(f"the overlap planner's budget must be >= 1, got {budget!r}")
        super().__init__(memory)
        self.budget = budget
        self._last: tuple[bytes, tuple[int, ...]] | None = None  # the latest plan
        # `points_of`'s latest: (the key object, n_input, points)
        self._of: tuple[bytes, int, tuple[int, ...]] | None = None

    def points(self, key: bytes) -> tuple[int, ...]:
        """At most `budget` positions (ascending) for the input `key` (int32 token bytes):
        `place` over the distribution learnt so far. No side effect but a one-plan memo
        (the live cache and every shadow ask for the same input in turn)."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        n = len(key) // TOKEN_BYTES
        end = self.books.end(n)
        if end > CANDIDATES:  # `thin(*self.distribution(n))`, walking only what it keeps
            depths, survival = self.thinned(end)
        else:
            depths, survival = self.distribution(n)
        points = place(depths, survival, self.budget)[1]
        self._last = (key, points)
        return points

    def points_of(self, key: bytes, n_input: int) -> tuple[int, ...]:
        """`points` of the input, the first `n_input` tokens of `key`; asked again with the
        same key object (the live cache's admission and every shadow's, in turn, until the
        next request is learnt), the same answer without reading the key again."""
        last = self._of
        if last is not None and last[0] is key and last[1] == n_input:
            return last[2]
        points = self.points(key[: n_input * TOKEN_BYTES])
        self._of = (key, n_input, points)
        return points

    def thinned(self, end: int, per_doubling: int = PER_DOUBLING
                ) -> tuple[list[int], list[float]]:
        """`thin` of the distribution of the first `end` distinct depths, found by
        bisection (each kept depth is the first at least 2^(1/per_doubling) times the
        last) and its survival from the running counts, without walking the depths
        between: the same depths and the same doubles (the same integers divided)."""
        return self.books.thinned(end, 2.0 ** (1.0 / per_doubling))

    def learn(self, key: bytes, n_input: int) -> None:
        """Add a request (`key`: its input and output, int32 token bytes; its first
        `n_input` tokens the input) to the distribution and its tokens to those seen."""
        if len(key) % TOKEN_BYTES or not 0 <= n_input * TOKEN_BYTES <= len(key):
            raise ValueError(f"learn: n_input={n_input!r} outside the sequence (or the key "
                             f"is not int32 bytes: {len(key)} bytes)")
        self.add(self.depth(key[: n_input * TOKEN_BYTES]), key)
        self._last = self._of = None
