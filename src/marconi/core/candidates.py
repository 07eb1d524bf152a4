"""`Candidates`: Marconi's eviction candidates, the set every scored eviction shares.

A candidate is a node in the tree, unpinned, with at most one child (a leaf is removed, a
one-child node merged into its child). Each has a row in dense numpy columns (`Columns`):
`rec`, the owning policy's stamp at the node's last change, and with a model `eff`, the
prefill FLOPs the node saves over its parent per byte it holds; a policy adds columns of
its own (`extra`) and fills them. The policy owns the score: it scores the columns in row
order and `lowest` picks the victim, so FlopAware, GreedyDual-FLOP, hit density and SegLen
differ only in what a touch stamps and how the columns score: each is a `Scored` eviction,
which keeps the set current on every event and evicts the lowest-scoring candidate.

```
event -> policy stamps the node -> update(node): add / refresh rec, eff / drop
victim -> policy.scores(now) over columns[:n] -> lowest(score, protected) -> row -> Victim
```
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from marconi.core.books import CoreBooks
from marconi.core.columns import Columns
from marconi.core.policy import Action, Eviction, Victim, alive, check_alpha
from marconi.core.priority import Candidates as Among
from marconi.core.priority import Feature, Score, Touches
from marconi.core.scores import check_features, evaluate
from marconi.core.spec import ModelSpec
from marconi.core.tree import Node


class Efficiency:
    """Prefill FLOPs a node saves over its parent, per byte it holds (Marconi's `eff`).

    F(depth) is memoized as an int (depths recur node after node); bytes per token of KV
    and per state are read once (the spec is frozen, and both are computed properties).
    """

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._flops: dict[int, int] = {}
        self._token_bytes, self._state_bytes = spec.kv_bytes_per_token, spec.ssm_bytes

    def __call__(self, node: Node) -> float:
        parent_depth = node.parent.depth if node.parent is not None else 0
        held = (self._token_bytes * node.edge_len
                + (self._state_bytes if node.has_state else 0))
        saved = self.flops_at(node.depth) - self.flops_at(parent_depth)
        return saved / held if held else 0.0

    def flops_at(self, depth: int) -> int:
        flops = self._flops.get(depth)
        if flops is None:
            flops = self._flops[depth] = self.spec.flops(depth)
        return flops


def replay_length(node: Node) -> int:
    """Tokens from the nearest ancestor holding a state (the root: none) to `node`."""
    cur = node.parent
    while cur is not None and cur.parent is not None and not cur.has_state:
        cur = cur.parent
    return node.depth - (cur.depth if cur is not None else 0)


class Candidates:
    """The candidate nodes of one policy, in `Columns` columns kept current by `update`.

    `stamp` is the owning policy's dict of stamps (shared, not copied: a snapshot restores
    the policy's stamps and this set reads them); `efficiency` given, an `eff` column holds
    each candidate's FLOP efficiency.
    """

    def __init__(self, stamp: dict[Node, float], efficiency: Efficiency | None = None,
                 extra: Mapping[str, npt.DTypeLike] | None = None) -> None:
        self.stamp = stamp
        self.efficiency = efficiency
        columns: dict[str, npt.DTypeLike] = {"rec": np.float64}
        if efficiency is not None:
            columns["eff"] = np.float64
        self.columns = Columns({**columns, **(extra or {})})

    def __len__(self) -> int:
        return len(self.columns)

    def __contains__(self, node: object) -> bool:
        return node in self.columns

    def update(self, node: Node) -> int | None:
        """After a change to `node`: give it a row (or refresh its `rec` and `eff`) if it
        is a candidate, else drop it. Returns its row, None when it is no candidate."""
        columns = self.columns
        if alive(node) and not node.pins and len(node.children) <= 1:
            row = columns.index.get(node)
            if row is None:
                row = columns.add(node)
            columns["rec"][row] = self.stamp.get(node, 0)
            if self.efficiency is not None:
                columns["eff"][row] = self.efficiency(node)
            return row
        if node in columns:
            columns.drop(node)
        return None

    def discard(self, node: Node) -> None:
        """`node` left the tree: drop its row if it has one."""
        if node in self.columns:
            self.columns.drop(node)

    def lowest(self, score: np.ndarray, protected: Collection[Node]) -> int | None:
        """The row of the lowest `score` (one per candidate, row order) outside
        `protected`, whose entries it sets to +inf in place; None when all are protected."""
        index = self.columns.index
        for node in protected:
            row = index.get(node)
            if row is not None:
                score[row] = np.inf
        row = int(np.argmin(score))
        return row if np.isfinite(score[row]) else None

    def victim(self, row: int) -> Victim:
        """Evicting the candidate in `row`: a leaf is removed, a one-child node merged."""
        node = self.columns.nodes[row]
        return Victim(node, Action.REMOVE if node.is_leaf else Action.MERGE)

    def nodes(self) -> list[Node]:
        return list(self.columns.nodes)

    def check(self, nodes: Sequence[Node]) -> None:
        """Assert the set is the tree's candidates among `nodes`, each in its own row
        with its current stamp and efficiency."""
        expected = {n for n in nodes if not n.pins and len(n.children) <= 1}
        got = set(self.columns.nodes)
        assert got == expected, (f"candidates differ: extra {got - expected}, "
                                 f"missing {expected - got}")
        columns = self.columns
        for node in got:
            row = columns.index[node]
            assert columns.nodes[row] is node, f"{node!r} is not in its row"
            if self.efficiency is not None:
                assert columns["eff"][row] == self.efficiency(node), (
                    f"stale efficiency for {node!r}")
            assert columns["rec"][row] == self.stamp.get(node, 0), (
                f"stale recency for {node!r}")


class Scored(Eviction):
    """An eviction over `Candidates` that evicts the candidate its `scores` rank lowest.

    A lookup touches the node it resumes from and a commit the nodes it creates (Marconi's
    touches): each is stamped `touched(now)` (the clock, unless a policy stamps something
    else) and its row refreshed by `changed`; a node leaving the tree leaves the set.
    """

    def __init__(self, efficiency: Efficiency | None = None,
                 extra: Mapping[str, npt.DTypeLike] | None = None) -> None:
        super().__init__()
        self.candidate_set = Candidates(self.stamp, efficiency, extra)
        self.columns = self.candidate_set.columns

    def touched(self, now: int) -> float:
        """What a touch at clock `now` stamps: the clock."""
        return now

    def on_lookup(self, path: Iterable[Node], hit: Node | None, now: int) -> None:
        if hit is not None:
            self.stamp[hit] = self.touched(now)
            self.changed(hit)

    def on_commit(self, path: Iterable[Node], new: Iterable[Node], now: int) -> None:
        for node in new:
            self.stamp[node] = self.touched(now)
            self.changed(node)

    def changed(self, node: Node) -> None:
        self.candidate_set.update(node)

    def removed(self, node: Node) -> None:
        super().removed(node)
        self.candidate_set.discard(node)

    @abstractmethod
    def scores(self, now: int) -> np.ndarray:
        """Each candidate's score at clock `now`, in row order (a fresh array: `victim`
        overwrites the protected ones)."""

    def victim(self, protected: Collection[Node], now: int) -> Victim | None:
        if not self.columns:
            return None
        score = self.scores(now)
        row = self.candidate_set.lowest(score, protected)
        if row is None:
            return None
        self.chose(float(score[row]))
        return self.candidate_set.victim(row)

    def chose(self, score: float) -> None:
        """Told the score of the victim just chosen (default: nothing)."""
        return None

    def candidates(self) -> list[Node]:
        return self.candidate_set.nodes()

    def check(self, nodes: Sequence[Node]) -> None:
        self.candidate_set.check(nodes)


class Declared(Scored):
    """A declared `Score` (marconi.core.priority) evaluated over the candidates, on the
    Python core: `RECENCY` the stamp of a node's last touch, `INVERSE_AGE` from it,
    `EFFICIENCY` its column (given a model), `REPLAY` read at each choice (a state gained
    or lost above a candidate changes it without the candidate changing), `LEVEL` the
    stamp of a node's last touch where a touch stamps the level (`level`: the highest
    victim's score so far). A score reading another feature, or other candidates or
    touches than `Scored`'s, is refused."""

    FEATURES = frozenset({Feature.RECENCY, Feature.INVERSE_AGE, Feature.EFFICIENCY,
                          Feature.REPLAY, Feature.LEVEL})
    # the compiled core evaluates a score of the form `compiled_forms.score_form` maps
    # (any other runs on the Python core, the reason printed); a subclass declares its own
    compiled_as = "scored"

    def __init__(self, score: Score, spec: ModelSpec | None = None,
                 alpha: float | None = None,
                 extra: Mapping[str, npt.DTypeLike] | None = None) -> None:
        who = f"the Python core's {type(self).__name__}"
        have = self.FEATURES if spec is not None else self.FEATURES - {Feature.EFFICIENCY}
        check_features(score, have, who)
        if score.candidates is not Among.ONE_CHILD or score.touches is not Touches.HIT:
            raise ValueError(f"{who} cannot evaluate score {score.name!r}: it runs "
                             "candidates of at most one child and touches of the hit")
        self.efficiency = Efficiency(spec) if Feature.EFFICIENCY in score.features \
            and spec is not None else None
        super().__init__(self.efficiency, extra)
        self.score = score
        self.alpha = check_alpha(alpha if alpha is not None else 0.0) if score.tuned \
            else None
        self.level = 0.0  # (a leveled score's) the highest victim's score so far
        self._leveled = score.leveled  # (read at every touch)
        self._features = score.features  # (read at every choice)

    def core_books(self) -> CoreBooks:
        return CoreBooks(score=self.score, level=self.level)

    def touched(self, now: int) -> float:
        """What a touch stamps: the level where the score reads it, else the clock."""
        return self.level if self._leveled else now

    def chose(self, score: float) -> None:
        """A leveled score's victim raises the level to its own score."""
        if self._leveled:
            self.level = max(self.level, score)

    def follow(self, now: int) -> None:
        """A leveled score, when another policy chose the victim (a `Switchable` expert
        not running), raises its level to where its own victim would put it, so that a
        switch to it finds a live order (frozen, the level would rank by the other terms
        alone until it caught up)."""
        if self._leveled and self.columns:
            self.level = max(self.level, float(self.scores(now).min()))

    def values(self, now: int) -> dict[Feature, np.ndarray]:
        """Each feature the score reads, per candidate in row order."""
        columns, features = self.columns, self._features
        n = len(columns)
        rec = columns["rec"][:n]
        out = {Feature.LEVEL if self._leveled else Feature.RECENCY: rec}
        if Feature.INVERSE_AGE in features:
            out[Feature.INVERSE_AGE] = 1.0 / (now - rec + 1.0)
        if Feature.EFFICIENCY in features:
            out[Feature.EFFICIENCY] = columns["eff"][:n]
        if Feature.REPLAY in features:
            out[Feature.REPLAY] = np.array([replay_length(node) for node in columns.nodes],
                                           dtype=np.float64)
        return out

    def scores(self, now: int) -> np.ndarray:
        """Each candidate's declared score, in row order."""
        return evaluate(self.score, self.values(now), self.alpha or 0.0)
