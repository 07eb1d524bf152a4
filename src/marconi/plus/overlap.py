"""marconi+'s overlap planner: sparse prefix caching's checkpoint placement as something
an admission expert can add (`Boundaries.OVERLAP`, `marconi+-overlap`).

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
Memory: every sequence seen is kept as a token radix tree (about 4 bytes per distinct
token seen) and every overlap depth as an int, and each plan walks the distribution
(`O(requests x budget)`): meant for replays and bounded streams, not an unbounded server.
"""

from __future__ import annotations

from bisect import insort

from marconi.core.tree import TOKEN_BYTES, RadixTree
from marconi.peers.sparse_prefix import distribution, place, spell


class OverlapPlanner:
    """Checkpoint positions for an input from the overlap depths of the requests learnt
    so far (`points`), and the learning (`learn`), once per request."""

    def __init__(self, budget: int = 4) -> None:
        if budget < 1:
            raise ValueError(f"the overlap planner's budget must be >= 1, got {budget!r}")
        self.budget = budget
        self.seen = RadixTree()  # every sequence learnt
        self.overlaps: list[int] = []  # overlap depth of each request learnt, ascending
        self.zeros = 0  # requests learnt that overlapped nothing
        self._last: tuple[bytes, tuple[int, ...]] | None = None  # the latest plan

    @property
    def requests(self) -> int:
        """Requests learnt so far."""
        return len(self.overlaps) + self.zeros

    def points(self, key: bytes) -> tuple[int, ...]:
        """At most `budget` positions (ascending) for the input `key` (int32 token bytes):
        `place` over the distribution learnt so far. No side effect but a one-plan memo
        (the live cache and every shadow ask for the same input in turn)."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        depths, survival = distribution(self.overlaps, self.zeros, len(key) // TOKEN_BYTES)
        points = place(depths, survival, self.budget)[1]
        self._last = (key, points)
        return points

    def learn(self, key: bytes, n_input: int) -> None:
        """Add a request (`key`: its input and output, int32 token bytes; its first
        `n_input` tokens the input) to the distribution and its tokens to those seen."""
        if len(key) % TOKEN_BYTES or not 0 <= n_input * TOKEN_BYTES <= len(key):
            raise ValueError(f"learn: n_input={n_input!r} outside the sequence (or the key "
                             f"is not int32 bytes: {len(key)} bytes)")
        depth = self.seen.match(key[: n_input * TOKEN_BYTES]).length
        if depth:
            insort(self.overlaps, depth)
        else:
            self.zeros += 1
        spell(self.seen, key)
        self._last = None
