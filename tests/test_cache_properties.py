"""Random sequences of lookup / commit / pin / unpin / evict, checked after every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.tree import Node
from marconi.paper.admission import Block
from marconi.systems import make_cache
from tests.helpers import CACHES, SMALL, ListStore, examples

PREFIXES = [[], [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7] * 12, [5, 6, 5, 6, 5]]
suffixes = st.lists(st.integers(0, 9), min_size=1, max_size=14)
inputs = st.tuples(st.sampled_from(PREFIXES), suffixes).map(lambda t: t[0] + t[1])
outputs = st.lists(st.integers(0, 9), max_size=5)


def state_prefixes(cache: PrefixCache) -> list[list[int]]:
    """Brute force: the token prefix of every node holding a state."""
    return [[t for n in cache.path(node) for t in n.tokens().tolist()]
            for node in cache.tree.nodes() if node.has_state]


def reference_hit(prefixes: list[list[int]], inp: list[int], limit: int | None = None) -> int:
    """Longest state prefix of `inp` no longer than `limit` (default: the input length)."""
    limit = len(inp) if limit is None else limit
    return max((len(p) for p in prefixes if len(p) <= limit and inp[: len(p)] == p),
               default=0)


class CacheMachine(RuleBasedStateMachine):
    @initialize(system=st.sampled_from(sorted(CACHES)), capacity=st.integers(0, 400_000),
                alpha=st.sampled_from([0.0, 0.5, 2.0]))
    def make(self, system: str, capacity: int, alpha: float) -> None:
        self.cache = make_cache(SMALL, capacity, system, alpha=alpha, store=ListStore())
        self.pinned: list[Node] = []
        self.last: Node | None = None

    @rule(inp=inputs, out=outputs)
    def request(self, inp: list[int], out: list[int]) -> None:
        limit = self.cache.admission.max_hit(len(inp))
        expected = reference_hit(state_prefixes(self.cache), inp, limit)
        plan = self.cache.lookup(inp)
        assert plan.hit == expected
        if plan.node is not None:
            assert plan.node.has_state and plan.node.depth == plan.hit <= len(inp)
            spelled = [t for n in self.cache.path(plan.node) for t in n.kv]
            assert spelled == inp[: plan.hit]
        assert all(plan.hit < c <= len(inp) for c in plan.checkpoints)
        self.last = plan.node
        full = inp + out
        states = {p: ("state", p) for p in self.cache.required_states(full, len(inp))}
        self.cache.commit(full, len(inp), states=states, kv=full)

    @precondition(lambda self: self.cache.tree.size > 0)
    @rule(i=st.integers(0, 50), hit=st.booleans())
    def pin(self, i: int, hit: bool) -> None:
        nodes = self.cache.tree.nodes()
        node = self.last if hit and self.last is not None and self.last.parent else None
        node = node or nodes[i % len(nodes)]
        self.cache.pin(node)
        self.pinned.append(node)

    @precondition(lambda self: bool(self.pinned))
    @rule(i=st.integers(0, 10))
    def unpin(self, i: int) -> None:
        self.cache.unpin(self.pinned.pop(i % len(self.pinned)))

    @rule(nbytes=st.integers(0, 200_000))
    def evict(self, nbytes: int) -> None:
        before = self.cache.bytes
        freed = self.cache.evict(nbytes)
        assert freed == before - self.cache.bytes >= 0

    @invariant()
    def consistent(self) -> None:
        check_integrity(self.cache)
        for node in self.pinned:
            assert node.parent is not None, f"pinned {node!r} was evicted"
        for node in self.cache.tree.nodes():
            if node.has_state:
                assert node.state == ("state", node.depth)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=examples(150), stateful_step_count=30,
                                     deadline=None)


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class JudiciousReference:
    """Infinite-cache judicious admission over a plain list of sequences."""

    def __init__(self) -> None:
        self.seqs: list[list[int]] = []
        self.states: set[tuple[int, ...]] = set()

    def branch(self, x: list[int]) -> int | None:
        best = max((lcp(x, s) for s in self.seqs), default=0)
        mid_edge = any(lcp(x, s) == best and len(s) > best for s in self.seqs)
        if 0 < best < len(x) and mid_edge and tuple(x[:best]) not in self.states:
            return best
        return None

    def hit(self, inp: list[int]) -> int:
        return reference_hit([list(s) for s in self.states], inp)

    def commit(self, x: list[int]) -> None:
        p = self.branch(x)
        if p is not None:
            self.states.add(tuple(x[:p]))
        self.states.add(tuple(x))
        self.seqs.append(x)


@settings(max_examples=examples(120), deadline=None)
@given(st.lists(st.tuples(inputs, outputs), min_size=1, max_size=25),
       st.sampled_from(["sglang+", "marconi"]))
def test_judicious_matches_list_reference(requests: list, system: str) -> None:
    cache = make_cache(SMALL, "1TB", system)
    ref = JudiciousReference()
    for inp, out in requests:
        plan = cache.lookup(inp)
        assert plan.hit == ref.hit(inp)
        p = ref.branch(inp)
        assert plan.checkpoints == ((p,) if p is not None and p > plan.hit else ())
        cache.commit(inp + out, len(inp))
        ref.commit(inp + out)
    assert {tuple(p) for p in state_prefixes(cache)} == ref.states


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(inputs, outputs), min_size=1, max_size=20), st.integers(1, 6))
def test_block_admission_matches_list_reference(requests: list, block: int) -> None:
    cache = make_cache(SMALL, "1TB", "vllm+")
    cache.admission = Block(block)
    states: set[tuple[int, ...]] = set()
    seqs: list[tuple[int, ...]] = []
    for inp, out in requests:
        assert cache.lookup(inp).hit == reference_hit([list(s) for s in states], inp)
        full = inp + out
        cache.commit(full, len(inp))
        seqs.append(tuple(full))
        states |= {tuple(full[:p]) for p in range(block, len(full) + 1, block)}
        states.add(tuple(full))
        states -= grown(states, seqs, tuple(full), block)
    assert {tuple(p) for p in state_prefixes(cache)} == states


def grown(states: set[tuple[int, ...]], seqs: list[tuple[int, ...]], full: tuple[int, ...],
          block: int) -> set[tuple[int, ...]]:
    """Partial-block states `full` extends that have one continuation: they grow in place."""
    out = set()
    for p in states:
        if len(p) % block and len(p) < len(full) and full[: len(p)] == p:
            nexts = {s[len(p)] for s in seqs if len(s) > len(p) and s[: len(p)] == p}
            if len(nexts) == 1:
                out.add(p)
    return out
