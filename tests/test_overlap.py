"""marconi+'s overlap expert (`Boundaries.OVERLAP`, `marconi+-overlap`): sparse prefix
caching's placement learnt from the live stream and shared with the shadows."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.tree import Node
from marconi.peers.sparse_prefix import SparsePrefix
from marconi.plus.admission import PLAIN, StructureConfig, Structured
from marconi.plus.overlap import OverlapPlanner
from marconi.plus.shadows import (
    DEFAULT_EXPERTS,
    OVERLAP_MEMORY,
    SGLANG_PLUS,
    Boundaries,
    Expert,
    ShadowConfig,
    ShadowTuner,
    apply,
    shadow_tuner,
)
from marconi.plus.switchable import Mode, Switchable
from marconi.systems import TunerOptions, get_system, make_cache
from tests.helpers import SMALL, serve

OVERLAP_GD = Expert(Boundaries.OVERLAP, Mode.FLOP)


def _stream(n: int, seed: int = 0) -> list[tuple[np.ndarray, int]]:
    """(tokens, n_input) of `n` requests: each input a prefix, of one of a few depths, of
    one of six documents, then a tail of its own; each output its own."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1000, 30_000, 1200) for _ in range(6)]
    out = []
    for _ in range(n):
        doc = docs[int(rng.integers(0, len(docs)))]
        depth = int(rng.choice((100, 300, 600, 1100)))
        tail = rng.integers(40_000, 60_000, int(rng.integers(5, 60)))
        output = rng.integers(40_000, 60_000, int(rng.integers(1, 20)))
        inp = np.concatenate([doc[:depth], tail])
        out.append((np.concatenate([inp, output]).astype(np.int32), len(inp)))
    return out


def test_planner_places_what_sparse_prefix_places() -> None:
    """Taught each request after its commit, the planner plans every input as the
    sparse-prefix peer does (the same distribution, the same dynamic program)."""
    cache = make_cache(SMALL, "1GB", "sparse-prefix")
    peer = cache.admission
    assert isinstance(peer, SparsePrefix)
    planner = OverlapPlanner(peer.budget)
    placed = 0
    for tokens, n_input in _stream(120):
        key = tokens[:n_input].tobytes()
        assert planner.points(key) == peer.plan(key)[1]
        placed += len(planner.points(key))
        cache.lookup(tokens[:n_input])
        cache.commit(tokens, n_input)
        planner.learn(tokens.tobytes(), n_input)
    assert placed > 100 and planner.requests == 120


def _flops(cache: PrefixCache, stream: list[tuple[np.ndarray, int]]) -> float:
    return sum(cache.spec.flops(serve(cache, None, t, n)) for t, n in stream)


@pytest.fixture(scope="module")
def replayed() -> tuple[ShadowTuner, float]:
    """marconi+-overlap's tuner after the stream (no message boundaries), and what
    sparse-prefix's admission with GreedyDual-FLOP alone saves on it."""
    stream = _stream(300)
    capacity = 400 * 1000 * SMALL.kv_bytes_per_token
    system = get_system("marconi+-overlap")
    tuner = system.make_tuner(options=TunerOptions())
    assert isinstance(tuner, ShadowTuner)
    live = make_cache(SMALL, capacity, system)
    for tokens, n_input in stream:
        serve(live, tuner, tokens, n_input)
    check_integrity(live)
    alone = PrefixCache(SMALL, capacity, SparsePrefix(4), Switchable(SMALL, Mode.FLOP))
    return tuner, _flops(alone, stream)


def test_overlap_shadow_is_sparse_prefix_with_its_eviction(
        replayed: tuple[ShadowTuner, float]) -> None:
    """The overlap expert's shadow saves exactly what sparse-prefix's admission with the
    same eviction saves alone: it plans each request from the requests before it (taught
    after the shadows are fed), from the planner every admission shares, and it is fed
    though no request names a message boundary (it is nobody's twin)."""
    tuner, alone = replayed
    assert alone > 0
    assert tuner.report().totals[OVERLAP_GD] == pytest.approx(alone, rel=1e-12)
    none_gd = tuner.report().totals[Expert(Boundaries.NONE, Mode.FLOP)]
    assert none_gd != pytest.approx(alone)


def test_shadows_share_the_tuners_planner(replayed: tuple[ShadowTuner, float]) -> None:
    tuner, _ = replayed
    assert tuner.planner is not None and tuner.planner.requests == 300
    for shadow in tuner.shadows:
        assert isinstance(shadow.admission, Structured)
        assert shadow.admission.planner is tuner.planner


def test_boundary_twins_part_sharing_the_planner() -> None:
    """A request naming a boundary parts the boundary experts from their twins by copying
    the twins' shadows: the copies refer to the tuner's planner, not copies of it."""
    tuner = shadow_tuner(("density", "depth", "flop"), True, {}, overlap=True)
    cache = make_cache(SMALL, "1GB", "marconi+-overlap")
    stream = _stream(20)
    for tokens, n_input in stream[:10]:
        serve(cache, tuner, tokens, n_input)
    assert tuner._twins  # no boundary yet
    tokens, n_input = stream[10]
    serve(cache, tuner, tokens, n_input, (n_input // 2,))
    assert not tuner._twins
    assert all(s.admission.planner is tuner.planner for s in tuner.shadows)  # type: ignore[attr-defined]


def _nodes(cache: PrefixCache) -> list[Node]:
    out, stack = [], list(cache.tree.roots.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.depth:
            out.append(node)
    return out


def test_running_the_overlap_expert_keeps_sequences_to_their_last_state() -> None:
    """Live, the overlap expert admits only the planner's positions and keeps each
    sequence up to the last (KV past it serves no hybrid hit: every leaf ends on a state);
    judicious admission keeps whole sequences, outputs included."""
    leaves, tokens_held = {}, {}
    for expert in (OVERLAP_GD, Expert(Boundaries.NONE, Mode.FLOP)):
        tuner = ShadowTuner(ShadowConfig(experts=(expert,)))
        cache = make_cache(SMALL, "1GB", "marconi+-overlap")
        tuner.start(cache)
        for tokens, n_input in _stream(60, seed=1):
            serve(cache, tuner, tokens, n_input)
        check_integrity(cache)
        nodes = _nodes(cache)
        leaves[expert.boundaries] = [n.has_state for n in nodes if not n.children]
        tokens_held[expert.boundaries] = sum(len(n.key) for n in nodes)
    assert leaves[Boundaries.OVERLAP] and all(leaves[Boundaries.OVERLAP])
    assert tokens_held[Boundaries.OVERLAP] < tokens_held[Boundaries.NONE]


def test_overlap_without_a_planner_is_refused() -> None:
    with pytest.raises(ValueError, match="overlap planner"):
        Structured(StructureConfig(overlap=True))
    admission = Structured(PLAIN)
    with pytest.raises(ValueError, match="overlap planner"):
        admission.use_boundaries(first=False, last=False, overlap=True)
    assert admission.config == PLAIN  # left as it was
    cache = make_cache(SMALL, "1GB", "marconi+")
    with pytest.raises(ValueError, match="overlap planner"):
        apply(cache, OVERLAP_GD)


def test_marconi_plus_keeps_its_experts() -> None:
    """marconi+'s experts: every admission (no boundary, the first, the last, the overlap
    planner's positions) with every eviction but LRU, then `sglang+`'s configuration; its
    planner keeps a bounded memory, marconi+-overlap's every sequence, and
    marconi+-no-overlap has the nine message-boundary experts and sglang+'s."""
    tuner = get_system("marconi+").make_tuner(options=TunerOptions())
    assert isinstance(tuner, ShadowTuner)
    assert tuner.config.experts == DEFAULT_EXPERTS and len(DEFAULT_EXPERTS) == 13
    assert DEFAULT_EXPERTS[-1] == SGLANG_PLUS
    assert [e.boundaries for e in DEFAULT_EXPERTS[9:12]] == [Boundaries.OVERLAP] * 3
    assert tuner.config.overlap_memory == OVERLAP_MEMORY
    whole = get_system("marconi+-overlap").make_tuner(options=TunerOptions())
    assert isinstance(whole, ShadowTuner) and whole.config.overlap_memory is None
    assert whole.config.experts == DEFAULT_EXPERTS
    plain = get_system("marconi+-no-overlap").make_tuner(options=TunerOptions())
    assert isinstance(plain, ShadowTuner)
    assert plain.config.experts == (*DEFAULT_EXPERTS[:9], SGLANG_PLUS)
    assert not get_system("marconi+").unbounded and get_system("marconi+-overlap").unbounded


def test_planner_rejects_a_bad_request() -> None:
    planner = OverlapPlanner()
    with pytest.raises(ValueError, match="n_input=9"):
        planner.learn(np.arange(4, dtype=np.int32).tobytes(), 9)
    with pytest.raises(ValueError, match="budget"):
        OverlapPlanner(0)


def test_a_bounded_memory_forgets_the_oldest_sequences() -> None:
    """With `memory` tokens the planner measures overlap against the recent sequences
    only: past the bound the tree is rebuilt from the latest half, the oldest forgotten,
    the depths' counts kept whole; without it (the sparse-prefix peer) nothing is."""
    from marconi.peers.sparse_prefix import Overlaps

    def seq(i: int) -> bytes:
        return np.arange(1000 * i, 1000 * i + 100, dtype=np.int32).tobytes()

    bounded, whole = Overlaps(memory=250), Overlaps()
    for book in (bounded, whole):
        for i in range(5):  # 500 tokens learnt: twice the bound
            book.add(book.depth(seq(i)), seq(i))
    assert bounded.depth(seq(4)) == whole.depth(seq(4)) == 100  # the latest, kept
    assert bounded.depth(seq(0)) == 0 and whole.depth(seq(0)) == 100  # the first, forgotten
    assert bounded.requests == whole.requests == 5
    kept = sum(bounded.depth(seq(i)) == 100 for i in range(5))
    assert 1 <= kept <= 2  # at most half the bound after a rebuild (and at least one)
    with pytest.raises(ValueError, match="overlap memory"):
        Overlaps(memory=0)


def test_distribution_is_the_share_at_least_as_deep() -> None:
    """`place`'s input, shared by sparse-prefix and the planner: each distinct depth up to
    the input's length, and the share of all requests (those that overlapped nothing
    too) that overlapped at least that deep; a pending request counts as if learnt."""
    from marconi.peers.sparse_prefix import Overlaps

    book = Overlaps()
    for i, depth in enumerate((100, 300, 100, 0)):
        book.add(depth, np.array([i], dtype=np.int32).tobytes())
    assert book.distribution(250) == ([100], [0.75])
    assert book.distribution(300) == ([100, 300], [0.75, 0.25])
    assert book.distribution(99) == ([], [])
    assert book.distribution(300, pending=200) == ([100, 200, 300], [0.8, 0.4, 0.2])
    assert book.distribution(300, pending=100) == ([100, 300], [0.8, 0.2])
    assert book.distribution(150, pending=200) == ([100], [0.8])
    assert book.distribution(300, pending=0) == ([100, 300], [0.6, 0.2])
    assert book.requests == 4 and Overlaps().distribution(300) == ([], [])


def _taught(depths: list[int], zeros: int = 0) -> OverlapPlanner:
    """A planner taught one request per depth (each a prefix of one long sequence, then a
    token of its own) and `zeros` that overlap nothing."""
    planner = OverlapPlanner()
    base = np.arange(1, 70_000, dtype=np.int32)
    planner.learn(base.tobytes(), len(base))
    for i, depth in enumerate(depths):
        tokens = np.concatenate([base[:depth], [-1 - i]]).astype(np.int32)
        planner.learn(tokens.tobytes(), len(tokens))
    for i in range(zeros):
        planner.learn(np.array([-100_000 - i], dtype=np.int32).tobytes(), 1)
    return planner


def test_planner_distribution_counts_every_request() -> None:
    """Every request learnt counts: at each distinct depth up to `n`, the share of all of
    them (the base and the seven that overlapped nothing too) at least that deep."""
    rng = np.random.default_rng(3)
    depths = [int(d) for d in rng.integers(1, 5000, 400)]
    planner = _taught(depths, zeros=7)
    total = 1 + len(depths) + 7
    for n in (0, 10, 2500, 5000):
        distinct = sorted({d for d in depths if d <= n})
        share = [sum(d >= at for d in depths) / total for at in distinct]
        assert planner.distribution(n) == (distinct, share)


def test_many_depths_are_thinned_to_a_near_optimal_plan() -> None:
    """Past CANDIDATES distinct depths the dynamic program runs over one depth per
    1/16 doubling: its plan is one of those and reuses nearly what the exact plan does."""
    from marconi.peers.sparse_prefix import place
    from marconi.plus.overlap import CANDIDATES, thin

    rng = np.random.default_rng(4)
    depths = [int(d) for d in rng.integers(100, 60_000, 3 * CANDIDATES)]
    planner = _taught(depths)
    key = np.arange(1, 60_001, dtype=np.int32).tobytes()
    exact_depths, survival = planner.distribution(60_000)
    assert len(exact_depths) > CANDIDATES
    few, share = thin(exact_depths, survival)
    assert len(few) <= 16 * 10 and few[0] == exact_depths[0]
    assert all(b >= a * 2 ** (1 / 16) for a, b in pairwise(few))
    points = planner.points(key)
    assert set(points) <= set(few)
    exact_reuse, _ = place(exact_depths, survival, 4)
    reuse = sum((c - p) * share[few.index(c)] for p, c in zip((0, *points), points, strict=False))
    assert 0.95 * exact_reuse <= reuse <= exact_reuse


@pytest.mark.parametrize("seed", range(6))
def test_thinning_by_bisection_is_thinning_the_whole_distribution(seed: int) -> None:
    """`points` thins by bisection over running counts (`thinned`): the same depths and
    the same doubles as `thin(*distribution(n))`, at every cut `n`, as requests are
    learnt one by one (repeated depths, nothing overlapped, depths past the cut)."""
    from marconi.plus.overlap import CANDIDATES, thin

    rng = np.random.default_rng(seed)
    planner = OverlapPlanner()
    low = int(rng.integers(1, 50))
    pool = [int(d) for d in rng.integers(low, low + rng.integers(400, 20_000), 900)]
    for k in range(1200):
        depth = 0 if rng.random() < 0.1 else pool[int(rng.integers(len(pool)))]
        planner.add(depth, np.arange(1, 3, dtype=np.int32).tobytes())
        if (k % 97 and k < 1150) or not planner.depths:
            continue
        for n in (planner.depths[-1], planner.depths[len(planner.depths) // 2],
                  planner.depths[-1] + 1, int(rng.integers(1, planner.depths[-1] + 2))):
            end = int(np.searchsorted(planner.depths, n, side="right"))
            whole = thin(*planner.distribution(n))
            assert planner.thinned(end) == whole, (k, n)
    assert len(planner.depths) > CANDIDATES


def test_sampled_shadows_keep_the_planner_learning_every_request() -> None:
    """Once the shadows sample sessions, they still share the tuner's planner, and the
    planner still learns every request (the live stream's distribution, not the sample's)."""
    from marconi.workload import TraceOptions, load_trace

    trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=30, seed=5))
    experts = (Expert(Boundaries.NONE, Mode.DENSITY), OVERLAP_GD)
    tuner = ShadowTuner(ShadowConfig(experts=experts, sample_after=40, sample_rate=0.5))
    cache = make_cache(SMALL, "1GB", "marconi+-overlap")
    for r in trace:
        tokens = r.tokens()
        cache.lookup(r.input_tokens, boundaries=r.boundaries)
        cache.commit(tokens, r.n_input, boundaries=r.boundaries)
        tuner.observe(cache, tokens, r.n_input, r.boundaries, r.session_id)
    assert tuner.sampled_from == 40 and len(trace) > 60
    assert tuner.planner is not None and tuner.planner.requests == len(trace)
    assert all(s.admission.planner is tuner.planner for s in tuner.shadows)  # type: ignore[attr-defined]


def test_a_hedging_admission_adds_the_planner_positions_to_the_boundaries() -> None:
    """`hedge` (marconi+'s first requests): the overlap planner's positions beside the
    message boundaries and judicious admission's, each sequence kept whole, the same in
    the compiled core's hand-over (`extra_positions`) and the Python core's
    (`positions_at`); exclusive with `overlap`, and it needs a planner."""
    from marconi.core.tree import RadixTree

    planner = _taught([1000, 1000, 3000, 3000, 3000])
    key = np.arange(1, 5001, dtype=np.int32).tobytes()
    points = [p for p in planner.points_of(key, 5000) if p < 5000]
    assert points and not {100, 4000} & set(points)
    admission = Structured(PLAIN, planner).for_model(SMALL)
    admission.use_boundaries(first=True, last=True, hedge=True)
    positions, truncates = admission.extra_positions(key, 5000, (100, 2500, 4000))
    assert not truncates and not admission.truncates
    assert positions == tuple(sorted({100, 4000, *points}))
    match = RadixTree().match(key)
    assert {100, 4000, *points} <= set(admission.positions_at(match, 5000, 5000,
                                                              (100, 2500, 4000), key))
    admission.use_boundaries(first=True, last=True)  # the hedge over: boundaries alone
    assert admission.extra_positions(key, 5000, (100, 2500, 4000)) == ((100, 4000), False)
    assert not set(points) & set(admission.positions_at(match, 5000, 5000,
                                                        (100, 2500, 4000), key))
    with pytest.raises(ValueError, match="exclusive"):
        admission.use_boundaries(first=False, last=False, overlap=True, hedge=True)
    with pytest.raises(ValueError, match="needs an overlap planner"):
        Structured(PLAIN).use_boundaries(first=False, last=False, hedge=True)


def test_a_cold_planner_checkpoints_the_first_boundary() -> None:
    """Where the planner places nothing for an input (nothing learnt overlaps it yet), the
    overlap expert checkpoints the input's first message boundary in its place, the
    sequence kept up to it; where it places something, its positions alone. The same in
    the compiled core's hand-over and the Python core's."""
    from marconi.core.tree import RadixTree

    key = np.arange(1, 5001, dtype=np.int32).tobytes()
    bounds = (100, 2500, 4000)
    cold = Structured(PLAIN, OverlapPlanner()).for_model(SMALL)
    cold.use_boundaries(first=True, last=False, overlap=True)
    match = RadixTree().match(key)
    assert cold.extra_positions(key, 5000, bounds) == ((100,), True)
    assert cold.checkpoints_at(match, 5000, 0, bounds, key) == (100,)
    assert cold.positions_at(match, 5000, 5000, bounds, key) == (100,)
    assert cold.checkpoints_at(match, 5000, 100, bounds, key) == ()  # held: past the hit only
    cold.use_boundaries(first=False, last=False, overlap=True)
    assert cold.extra_positions(key, 5000, bounds) == ((), True)
    warm = Structured(PLAIN, _taught([1000, 1000, 3000, 3000, 3000])).for_model(SMALL)
    warm.use_boundaries(first=True, last=False, overlap=True)
    points = warm.planner.points_of(key, 5000)  # type: ignore[union-attr]
    assert points and 100 not in points
    assert warm.extra_positions(key, 5000, bounds) == (points, True)


@pytest.mark.parametrize("cold_boundary", [True, False], ids=["cold-boundary", "no-boundaries"])
@pytest.mark.parametrize("core", ["python", "compiled"])
def test_the_overlap_expert_reuses_a_system_prompt_from_its_second_use(
        core: str, cold_boundary: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run live from the first request, the overlap expert serves a shared system prompt
    on its second use: the first request overlaps nothing, so the planner places nothing
    and the first message boundary is checkpointed (without it the first sequence was not
    kept at all, and the prompt hit only once the planner had learnt its depth). Not in
    `marconi+-no-boundaries`, which checkpoints no message boundary."""
    from marconi.core import compiled

    monkeypatch.setenv(compiled.CORE_ENV, core)
    rng = np.random.default_rng(3)
    prompt = rng.integers(1000, 30_000, 500)
    tuner = ShadowTuner(ShadowConfig(experts=(OVERLAP_GD,), cold_boundary=cold_boundary))
    cache = make_cache(SMALL, "1GB", "marconi+")
    tuner.start(cache)
    hits = []
    for _ in range(3):
        tail = rng.integers(40_000, 60_000, 80)
        tokens = np.concatenate([prompt, tail, rng.integers(40_000, 60_000, 10)])
        hits.append(serve(cache, tuner, tokens, 580, (500,)))
    check_integrity(cache)
    assert hits == ([0, 500, 500] if cold_boundary else [0, 0, 0])
    ablation = get_system("marconi+-no-boundaries").make_tuner(options=TunerOptions())
    assert isinstance(ablation, ShadowTuner) and not ablation.config.cold_boundary
    assert Expert(Boundaries.OVERLAP, Mode.DENSITY) in ablation.config.experts
