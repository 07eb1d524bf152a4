"""Sparse prefix caching (Shirokikh and Nikolenko, arXiv 2605.05219; docs/peers.md,
"Other baselines"): states only at checkpoint positions chosen for the distribution of
overlap depths, under a checkpoint budget.

A request whose input shares `d` tokens with an earlier sequence (its overlap depth)
resumes from the deepest checkpoint at or before `d`. With checkpoints `c_1 < ... < c_k`
on a sequence and `S(x)` the share of requests whose overlap depth is at least `x`, the
tokens a request is expected to reuse are `sum_i (c_i - c_(i-1)) S(c_i)` (`c_0 = 0`). The
best `k <= budget` checkpoints lie at overlap depths seen (between two, moving a
checkpoint deeper only gains), and the dynamic program over those `N` depths,

    F_m(j) = x_j S_j + max_(i < j) (F_(m-1)(i) - x_i S_j),

is `O(N x budget)`: the lines `F_(m-1)(i) - x_i s` come in with falling slopes and are
asked at falling `S_j`, so a monotone hull answers each in amortized constant time.

Online: the distribution is that of the requests before this one (overlap depth: the
longest prefix of its input that some earlier request's input or output spelled, kept in
a radix tree of everything seen), so the first requests take no checkpoint.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence

import numpy as np

from marconi.core.compiled import DepthBooks, SequenceTree
from marconi.core.policy import Admission
from marconi.core.tree import TOKEN_BYTES, Match, RadixTree, first_mismatch


def place(depths: Sequence[int], survival: Sequence[float], budget: int
          ) -> tuple[float, tuple[int, ...]]:
    """The checkpoints (at most `budget`, among `depths`, ascending) that maximize the
    expected reuse `sum (c_i - c_(i-1)) S(c_i)`, and that reuse; `survival[j]` is S at
    `depths[j]`, not increasing. On the compiled core where it is chosen
    (`marconi.core.compiled.place`), else `place_python`, its oracle."""
    from marconi.core import compiled

    if depths and depths[-1] < 2**53 and compiled.chosen() == "compiled":
        return compiled.place(depths, survival, budget)
    return place_python(depths, survival, budget)


def place_python(depths: Sequence[int], survival: Sequence[float], budget: int
                 ) -> tuple[float, tuple[int, ...]]:
    """`place` in Python (the oracle of the compiled one)."""
    n = len(depths)
    if budget < 1 or n == 0:
        return 0.0, ()
    x = [0, *depths]  # index 0: no checkpoint before
    s = [1.0, *survival]
    prev = [0.0] + [float("-inf")] * n  # F_(m-1); with no checkpoint yet only index 0
    choice: list[list[int]] = []
    best, best_at = 0.0, (0, 0)
    for m in range(1, budget + 1):
        cur = [float("-inf")] * (n + 1)
        back = [0] * (n + 1)
        hull: list[int] = []  # line indices, slopes -x falling
        head = 0
        for j in range(1, n + 1):
            i = j - 1
            if prev[i] != float("-inf"):
                while len(hull) - head >= 2 and _useless(hull[-2], hull[-1], i, x, prev):
                    hull.pop()
                hull.append(i)
                head = min(head, len(hull) - 1)
            if len(hull) == head:
                continue
            q = s[j]
            while len(hull) - head >= 2 and _at(hull[head + 1], q, x, prev) >= \
                    _at(hull[head], q, x, prev):
                head += 1
            i = hull[head]
            cur[j], back[j] = _at(i, q, x, prev) + x[j] * q, i
            if cur[j] > best:
                best, best_at = cur[j], (m, j)
        choice.append(back)
        prev = cur
    out, (m, j) = [], best_at
    while m > 0 and j > 0:
        out.append(x[j])
        j, m = choice[m - 1][j], m - 1
    return best, tuple(reversed(out))


class Overlaps:
    """The overlap depths of the requests learnt so far (each distinct depth with its
    count, and the requests that overlapped nothing) and the sequences they spelled (a
    token radix tree, about 4 bytes per distinct token): what `place` plans from. Kept by
    the sparse-prefix peer and by marconi+'s overlap planner.

    `memory` (tokens; None: every sequence, as the sparse-prefix peer keeps them) bounds
    the sequences kept: once those learnt since the tree was last built spell more than
    `memory` tokens, the tree is rebuilt from the latest sequences spelling at most half
    of it, so overlap depths are measured against the recent past, and the tree holds at
    most `memory` tokens (rebuilding costs one more insertion per token learnt). The
    depths' counts are kept whole (one per distinct depth)."""

    def __init__(self, memory: int | None = None) -> None:
        if memory is not None and memory < 1:
            raise ValueError(f"the overlap memory must be >= 1 token or None, got {memory!r}")
        self.memory = memory
        self._recent: deque[bytes] = deque()  # the sequences spelled since the last build
        self._recent_tokens = 0
        self.seen = sequences()  # the sequences learnt (every one without `memory`)
        self.books = depth_books()  # the overlap depths learnt, with their counts

    @property
    def requests(self) -> int:
        """Requests learnt so far."""
        return self.books.overlapped + self.books.zeros

    @property
    def depths(self) -> list[int]:
        """The distinct overlap depths learnt, ascending (a copy)."""
        return self.books.depths()

    def depth(self, tokens: bytes) -> int:
        """Tokens of `tokens` (int32 bytes) that some sequence learnt spelled."""
        return self.seen.depth(tokens)

    def add(self, depth: int, tokens: bytes) -> None:
        """Learn a request that overlapped `depth` tokens and spelled `tokens` (its input
        and output)."""
        self.books.add(depth)
        self.seen.spell(tokens)
        if self.memory is not None:
            self._recent.append(tokens)
            self._recent_tokens += len(tokens) // TOKEN_BYTES
            if self._recent_tokens > self.memory:
                self._forget()

    def _forget(self) -> None:
        """Rebuild the tree from the latest sequences spelling at most `memory / 2`
        tokens (at least the latest one), the older ones forgotten."""
        assert self.memory is not None
        kept: list[bytes] = []
        tokens = 0
        for key in reversed(self._recent):
            n = len(key) // TOKEN_BYTES
            if kept and tokens + n > self.memory // 2:
                break
            kept.append(key)
            tokens += n
        kept.reverse()
        self.seen = sequences()
        for key in kept:
            self.seen.spell(key)
        self._recent, self._recent_tokens = deque(kept), tokens

    def distribution(self, n: int, pending: int | None = None
                     ) -> tuple[list[int], list[float]]:
        """The distinct depths learnt up to `n` (ascending) and at each the share of the
        requests learnt that overlapped at least that deep (`place`'s `depths` and
        `survival`); `pending`, one more request's depth counted as if learnt (no side
        effect)."""
        return self.books.distribution(n, pending)


class PyDepthBooks:
    """The overlap depths learnt, in Python (the oracle of the compiled core's
    `DepthBooks`): each distinct depth (ascending) with the requests learnt at it, and
    the requests that overlapped something or nothing."""

    def __init__(self) -> None:
        self._depths: list[int] = []  # the distinct overlap depths learnt, ascending
        self.counts: dict[int, int] = {}  # requests learnt at each of those depths
        self.tally = np.zeros(0, dtype=np.int64)  # the same counts in the order of depths
        self._below: np.ndarray | None = None  # running sums of `tally` (None: stale)
        self.overlapped = 0  # requests learnt that overlapped something
        self.zeros = 0  # requests learnt that overlapped nothing

    def add(self, depth: int) -> None:
        """Count a request that overlapped `depth` tokens."""
        if depth:
            i = bisect_left(self._depths, depth)
            if depth not in self.counts:
                self._depths.insert(i, depth)
                self.tally = np.insert(self.tally, i, 0)
                self.counts[depth] = 0
            self.counts[depth] += 1
            self.tally[i] += 1
            self._below = None
            self.overlapped += 1
        else:
            self.zeros += 1

    def depths(self) -> list[int]:
        return list(self._depths)

    def end(self, n: int) -> int:
        """How many distinct depths are at most `n`."""
        return bisect_right(self._depths, n)

    def distribution(self, n: int, pending: int | None) -> tuple[list[int], list[float]]:
        """`Overlaps.distribution`."""
        counts, overlapped = self.counts, self.overlapped
        total = overlapped + self.zeros
        depths = self._depths[: bisect_right(self._depths, n)]
        if pending is not None:
            total += 1
            overlapped += pending > 0
            if 0 < pending <= n and pending not in counts:
                insort(depths, pending)
        survival, below = [], 0
        for depth in depths:
            survival.append((overlapped - below) / total)
            below += counts.get(depth, 0) + (depth == pending)
        return depths, survival

    def thinned(self, end: int, step: float) -> tuple[list[int], list[float]]:
        """From the first `end` distinct depths, each kept one the first at least `step`
        times the last (found by bisection, the depths between not walked), with the share
        of the requests learnt that overlapped at least that deep (from the running
        counts)."""
        depths, below = self._depths, self.below()
        overlapped, total = self.overlapped, self.overlapped + self.zeros
        kept: list[int] = []
        share: list[float] = []
        i = 0
        while i < end:
            depth = depths[i]
            kept.append(depth)
            share.append((overlapped - int(below[i])) / total)
            i = bisect_left(depths, depth * step, i + 1, end)
        return kept, share

    def below(self) -> np.ndarray:
        """`below()[i]`: the requests learnt that overlapped less deep than the `i`-th depth
        but something (the running sums of `tally`, kept until the next request learnt;
        summed in numpy, once per request learnt: tens of thousands of depths on agents)."""
        if self._below is None:
            below = np.zeros(len(self.tally) + 1, dtype=np.int64)
            np.cumsum(self.tally, out=below[1:])
            self._below = below
        return self._below


def depth_books() -> PyDepthBooks | DepthBooks:
    """Empty books of overlap depths: on the compiled core where it is chosen."""
    from marconi.core import compiled

    return compiled.DepthBooks() if compiled.chosen() == "compiled" else PyDepthBooks()


class PySequences:
    """The sequences seen, as a token radix tree in Python (the oracle of the compiled
    core's `SequenceTree`)."""

    def __init__(self) -> None:
        self.tree = RadixTree()

    def depth(self, tokens: bytes) -> int:
        """Tokens of `tokens` (int32 bytes) that some sequence spelled."""
        return self.tree.match(tokens).length

    def spell(self, tokens: bytes) -> None:
        """Add the sequence `tokens`."""
        spell(self.tree, tokens)


def sequences() -> PySequences | SequenceTree:
    """An empty tree of the sequences seen: on the compiled core where it is chosen."""
    from marconi.core import compiled

    return compiled.SequenceTree() if compiled.chosen() == "compiled" else PySequences()


def spell(tree: RadixTree, tokens: bytes) -> None:
    """Add the sequence `tokens` to `tree` (every sequence seen: overlap depths are matched
    against it)."""
    match = tree.match(tokens)
    node = tree.root if match.node is None else match.node
    if match.partial is not None:
        node = tree.split(match.partial, match.offset)
    if match.length * TOKEN_BYTES < len(tokens):
        tree.insert(node, tokens[match.length * TOKEN_BYTES:])


def _at(i: int, q: float, x: Sequence[int], f: Sequence[float]) -> float:
    return f[i] - x[i] * q


def _useless(a: int, b: int, c: int, x: Sequence[int], f: Sequence[float]) -> bool:
    """Whether line `b` is nowhere above both `a` and `c` (slopes -x[a] > -x[b] > -x[c])."""
    # b is dominated iff the crossing of a and c lies above (in value) b's line there
    return (f[c] - f[a]) * (x[b] - x[a]) >= (f[b] - f[a]) * (x[c] - x[a])


class SparsePrefix(Admission):
    """States at the checkpoints `place` picks for each input from the overlap depths of
    the requests before it; a sequence is kept up to its last checkpoint."""

    truncates = True  # KV past the last checkpoint is never reusable
    compiled_as = "sparse"  # the compiled core runs it (marconi.core.compiled)

    def __init__(self, budget: int = 4) -> None:
        if budget < 1:
            raise ValueError(f"the checkpoint budget must be >= 1, got {budget!r}")
        self.budget = budget
        self.learnt = Overlaps()  # the requests committed so far
        self._planned: tuple[bytes, int, tuple[int, ...]] | None = None
        # the latest commit's (overlap depth, tokens), learnt when the next input is
        # planned: asking what a commit would admit (`required_states`) and the commit
        # itself then learn the request once (so do two commits of one sequence with no
        # lookup between: a request is a lookup and its commit)
        self._committed: tuple[int, bytes] | None = None

    def overlap(self, key: bytes) -> int:
        """Tokens of `key` that some earlier sequence spelled."""
        found = self.learnt.depth(key)
        if self._committed is not None:  # not yet learnt
            found = max(found, first_mismatch(key, self._committed[1]))
        return found

    def plan(self, key: bytes) -> tuple[int, tuple[int, ...]]:
        """(overlap depth, checkpoints) of the input `key`, from the requests before it;
        no side effect."""
        pending = None if self._committed is None else self._committed[0]
        # the latest commit counts, learnt or not
        depths, survival = self.learnt.distribution(len(key) // TOKEN_BYTES, pending)
        return self.overlap(key), place(depths, survival, self.budget)[1]

    def _plan(self, key: bytes) -> tuple[int, tuple[int, ...]]:
        planned = self._planned
        if planned is not None and planned[0] == key and self._committed is None:
            return planned[1], planned[2]
        self._learn()
        depth, points = self.plan(key)
        self._planned = (key, depth, points)
        return depth, points

    def preview(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                tokens: bytes = b"") -> tuple[int, ...]:
        _, points = self.plan(tokens[: n_input * TOKEN_BYTES])
        return tuple(p for p in points if p > hit)

    def checkpoints(self, match: Match, n_input: int, hit: int) -> tuple[int, ...]:
        raise NotImplementedError("SparsePrefix needs the input's tokens (checkpoints_at)")

    def checkpoints_at(self, match: Match, n_input: int, hit: int, boundaries: Sequence[int],
                       tokens: bytes = b"") -> tuple[int, ...]:
        _, points = self._plan(tokens[: n_input * TOKEN_BYTES])
        return tuple(p for p in points if p > hit)

    def positions(self, match: Match, n_total: int, n_input: int) -> tuple[int, ...]:
        raise NotImplementedError("SparsePrefix needs the input's tokens (positions_at)")

    def positions_at(self, match: Match, n_total: int, n_input: int, boundaries: Sequence[int],
                     tokens: bytes = b"") -> tuple[int, ...]:
        committed = self._committed
        if committed is not None and committed[1] == tokens:  # asked again: as planned
            assert self._planned is not None
            return self._planned[2]
        depth, points = self._plan(tokens[: n_input * TOKEN_BYTES])
        self._committed = (depth, tokens)
        return points

    def extra_positions(self, key: bytes, n_input: int, boundaries: Sequence[int],
                        phase: str = "lookup") -> tuple[tuple[int, ...], bool]:
        """What a compiled cache's core needs for one request (`key`: its tokens, at least
        the input's): the checkpoints and True (its only positions, the sequence kept up to
        the last), as `preview` ("peek"), `checkpoints_at` ("lookup"), `positions_at`
        ("commit": the request learnt when the next one is planned) or both of the last
        two ("serve": a lookup of the input, then the commit, as `PrefixCache.serve`) work
        them out."""
        if phase == "peek":
            return self.plan(key[: n_input * TOKEN_BYTES])[1], True
        if phase in ("lookup", "serve"):
            points = self._plan(key[: n_input * TOKEN_BYTES])[1]
            if phase == "lookup":
                return points, True
        elif phase != "commit":
            raise ValueError(f"extra_positions: phase {phase!r} is not peek, lookup, commit "
                             "or serve")
        return self.positions_at(None, 0, n_input, boundaries, key), True  # type: ignore[arg-type]

    def _learn(self) -> None:
        """Learn the latest commit's request."""
        if self._committed is None:
            return
        depth, tokens = self._committed
        self._committed = None
        self.learnt.add(depth, tokens)
