"""Declared scores (`core.priority.Score`): Marconi's order written once, in
`paper/eviction.py`, and evaluated by the Python core, the compiled core, the engines'
emulations and both plugins (docs/architecture.md, "Declared priorities")."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.candidates import Declared
from marconi.core.compiled import compiled_reason, score_form
from marconi.core.layout import Layout
from marconi.core.priority import Candidates, Feature, Key, Priority, Score, Term, Touches
from marconi.core.scores import (
    check_features,
    evaluate,
    first_lowest,
    in_python,
    normalized,
    order,
    ranks,
)
from marconi.core.spec import PAPER_7B
from marconi.engines.integrations import sglang as sglang_integration
from marconi.engines.integrations.common import declared_score
from marconi.engines.integrations.vllm import MIRROR as VLLM_MIRROR
from marconi.engines.integrations.vllm import StateOrder, flop_scores
from marconi.paper import eviction
from marconi.paper.eviction import MARCONI, MARCONI_INVERSE_AGE, FlopAware, Recency
from marconi.peers.seglen import SegLen, seglen_score
from marconi.plus.density import HIT_DENSITY
from marconi.plus.greedy_dual import GREEDY_DUAL_FLOP, GreedyDualFlop
from marconi.systems import get_system
from tests.helpers import SMALL

# Marconi's order with the efficiency weighed three times: a change to its one declaration
TRIPLE = Score("marconi-triple", terms=(Term(Feature.RECENCY),
                                        Term(Feature.EFFICIENCY, weight=3.0, tuned=True)))
# GreedyDual-FLOP's declaration changed: the efficiency weighed twice, the replay length added
LEVELED = Score("leveled", terms=(Term(Feature.LEVEL), Term(Feature.EFFICIENCY, weight=2.0),
                                  Term(Feature.REPLAY, weight=1e-3)), normalized=False)
ENGINES = ("sglang-2026+marconi", "vllm-2026+marconi")


def test_marconis_declaration_is_the_papers_formula() -> None:
    """minmax(recency) + alpha x minmax(efficiency), lowest first, ties in given order."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(2, 30))
        rec, eff = rng.random(n) * 100, rng.integers(0, 4, n) * 0.25
        alpha = float(rng.choice([0.0, 0.1, 1.0, 7.0]))
        got = evaluate(MARCONI, {Feature.RECENCY: rec, Feature.EFFICIENCY: eff}, alpha)
        assert np.array_equal(got, normalized(rec) + alpha * normalized(eff))
        ranked = order(MARCONI, {Feature.RECENCY: ranks(n), Feature.EFFICIENCY: eff}, alpha)
        score = normalized(ranks(n)) + alpha * normalized(eff)
        assert list(ranked) == sorted(range(n), key=lambda i: (score[i], i))


def test_python_evaluation_is_numpys_bit_for_bit() -> None:
    """`in_python` (the vLLM plugin's few candidates) against `evaluate`, on random
    declarations of one to three terms, fixed and tuned weights, normalized or not, ties
    and equal columns."""
    rng = np.random.default_rng(7)
    features = (Feature.RECENCY, Feature.EFFICIENCY, Feature.REPLAY)
    for _ in range(1500):
        k = int(rng.integers(1, 4))
        chosen = [features[int(i)] for i in rng.permutation(3)[:k]]
        terms = tuple(Term(f, weight=float(rng.choice([1.0, 0.85, 3.0, 1e-3])),
                           tuned=bool(rng.integers(2))) for f in chosen)
        score = Score("random", terms=terms, normalized=bool(rng.integers(2)))
        n = int(rng.integers(1, 50))
        values = {f: [float(v) for v in (rng.integers(0, 3, n) * 0.1 if rng.integers(3) == 0
                                         else rng.random(n) * 10.0 ** rng.integers(-3, 9))]
                  for f in chosen}
        alpha = float(rng.choice([0.0, 1e-3, 1 / 3, 2.0, 1e9]))
        plain = evaluate(score, {f: np.array(v) for f, v in values.items()}, alpha)
        assert in_python(score, values, alpha) == plain.tolist()
        assert first_lowest(score, values, alpha) == int(np.argmin(plain))


def test_every_evaluator_reads_the_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing Marconi's declaration in `paper/eviction.py` reaches the simulator's
    system, the engines' emulations and both plugins; the compiled core runs it over
    Marconi's candidates and over an engine's state list."""
    monkeypatch.setattr(eviction, "MARCONI", TRIPLE)
    monkeypatch.setitem(eviction.SCORES, Recency.TIME, TRIPLE)
    marconi = get_system("marconi").policies(PAPER_7B, 0.5)
    assert marconi[1].score is TRIPLE  # type: ignore[attr-defined]
    for name in ENGINES:
        assert get_system(name).policies(PAPER_7B, 0.5)[1].score is TRIPLE  # type: ignore[attr-defined]
    assert declared_score(sglang_integration.MIRROR, PAPER_7B) is TRIPLE
    assert declared_score(VLLM_MIRROR, PAPER_7B) is TRIPLE
    assert compiled_reason(PAPER_7B, *marconi, Layout()) is None
    for name in ENGINES:
        assert compiled_reason(PAPER_7B, *get_system(name).policies(PAPER_7B, 0.5),
                               Layout()) is None
    effs = [0.5, 0.1, 0.3, 0.1]
    scores = flop_scores(effs, 1.0, TRIPLE)
    assert scores == pytest.approx([k / 3 + 3.0 * (e - 0.1) / 0.4 for k, e in enumerate(effs)])


def test_the_compiled_core_evaluates_the_declared_forms_it_has() -> None:
    assert score_form(MARCONI, ranked=False) == ([0, 2], [1.0, 1.0], [False, True], True, False)
    assert score_form(MARCONI, ranked=True) == ([0, 2], [1.0, 1.0], [False, True], True, False)
    assert score_form(MARCONI_INVERSE_AGE, ranked=False) == (
        [1, 2], [1.0, 1.0], [False, True], True, False)
    assert score_form(seglen_score(0.85), ranked=False) == (
        [0, 3], [1.0, 0.85], [False, False], True, False)
    assert score_form(TRIPLE, ranked=False) == (
        [0, 2], [1.0, 3.0], [False, True], True, False)
    assert score_form(GREEDY_DUAL_FLOP, ranked=False) == (
        [4, 2], [1.0, 1.0], [False, False], False, False)
    assert score_form(HIT_DENSITY, ranked=False) == (
        [2, 5], [1.0, 1.0], [False, False], False, True)
    # over an engine's state list: any terms over recency and efficiency
    assert score_form(TRIPLE, ranked=True) == ([0, 2], [1.0, 3.0], [False, True], True, False)
    raw = Score("raw", terms=MARCONI.terms, normalized=False, product=True)
    assert score_form(raw, ranked=True) == ([0, 2], [1.0, 1.0], [False, True], False, True)
    hits = Score("hits", terms=(Term(Feature.RECENCY), Term(Feature.HITS)))
    over_a_list = "recency, efficiency over an engine's state list, not"
    for score, ranked, words in (
            (MARCONI_INVERSE_AGE, True, f"{over_a_list} inverse-age"),
            (GREEDY_DUAL_FLOP, True, f"{over_a_list} level"),
            (HIT_DENSITY, True, f"{over_a_list} density"),
            (hits, False, "efficiency, replay, level, density, not hits")):
        form = score_form(score, ranked)
        assert isinstance(form, str) and words in form, form


def test_each_evaluator_refuses_what_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    depth = Score("by-depth", terms=(Term(Feature.RECENCY), Term(Feature.REPLAY, tuned=True)))
    from marconi.engines.integrations.vllm_offload import MarconiCachePolicy

    monkeypatch.setattr(eviction, "MARCONI", depth)
    monkeypatch.setitem(eviction.SCORES, Recency.TIME, depth)
    with pytest.raises(ValueError, match="reads replay, and marconi's offload policy"):
        MarconiCachePolicy(1 << 20, PAPER_7B, 1.0)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="reads replay, and marconi's order in SGLang"):
        sglang_integration.FlopOrder(PAPER_7B, depth)
    with pytest.raises(ValueError, match="reads level, and marconi's order in SGLang"):
        sglang_integration.FlopOrder(PAPER_7B, GREEDY_DUAL_FLOP)
    with pytest.raises(ValueError, match="reads level, and marconi's order in vLLM computes"):
        StateOrder(PAPER_7B, GREEDY_DUAL_FLOP)
    with pytest.raises(ValueError, match="reads level, which an unnormalized score only"):
        Score("s", terms=(Term(Feature.LEVEL), Term(Feature.EFFICIENCY)))
    with pytest.raises(ValueError, match="reads level and recency: a touch stamps the level"):
        Score("s", terms=(Term(Feature.LEVEL), Term(Feature.RECENCY)), normalized=False)
    with pytest.raises(ValueError, match="reads efficiency, and the Python core's Declared"):
        Declared(MARCONI)  # no model: no efficiency
    with pytest.raises(ValueError, match="touches of the hit"):
        Declared(Score("paths", terms=(Term(Feature.RECENCY),), touches=Touches.PATH))
    with pytest.raises(ValueError, match="candidates of at most one child"):
        Declared(Score("leaves", terms=(Term(Feature.RECENCY),), candidates=Candidates.LEAVES))
    with pytest.raises(ValueError, match="a key reads a node's own features, not 'efficiency'"):
        Priority("p", keys=(Key(Term(Feature.EFFICIENCY)),))
    with pytest.raises(ValueError, match="is tuned, and a Priority has no alpha"):
        Priority("p", keys=(Key(Term(Feature.HITS, tuned=True)),))
    with pytest.raises(ValueError, match="is a step"):
        Score("s", terms=(Term(Feature.HITS, at_least=2),))
    with pytest.raises(ValueError, match="weights are >= 0"):
        Score("s", terms=(Term(Feature.RECENCY, weight=-1.0),))


def test_the_policies_keep_their_declarations() -> None:
    assert FlopAware(PAPER_7B, 1.0).score is MARCONI
    assert FlopAware(PAPER_7B, 1.0, Recency.INVERSE_AGE).score is MARCONI_INVERSE_AGE
    assert SegLen(0.5).score == seglen_score(0.5) and SegLen(0.5).alpha is None
    assert GreedyDualFlop(PAPER_7B).score is GREEDY_DUAL_FLOP
    assert GREEDY_DUAL_FLOP.leveled and not MARCONI.leveled


def test_a_leveled_score_stamps_the_level_and_each_victim_raises_it() -> None:
    """GreedyDual-FLOP as declared: a touch stamps the level (not the clock), a victim
    raises the level to its own score, and the score is level + efficiency, unnormalized."""
    from marconi.core.cache import PrefixCache
    from marconi.paper.admission import Judicious

    policy = Declared(GREEDY_DUAL_FLOP, SMALL)
    cache = PrefixCache(SMALL, "400KB", Judicious(), policy)
    rng = np.random.default_rng(2)
    levels = [0.0]
    for _ in range(120):
        tokens = rng.integers(0, 1000, int(rng.integers(30, 200)))
        cache.lookup(tokens)
        if len(policy.columns):
            n = len(policy.columns)
            expected = policy.columns["rec"][:n] + policy.columns["eff"][:n]
            assert np.array_equal(policy.scores(cache.clock), expected)
        cache.commit(tokens, len(tokens))
        levels.append(policy.level)
    assert cache.stats.evictions > 0 and levels[-1] > 0
    assert levels == sorted(levels)  # the level never falls
    n = len(policy.columns)
    assert set(policy.columns["rec"][:n].tolist()) <= set(levels)  # stamps are levels


def test_an_engines_own_order_is_taken_only_where_the_score_is_recencys() -> None:
    """The emulations and plugins take their list's LRU head where the declared score
    orders by recency alone: Marconi's at alpha 0, not a score with a fixed other term."""
    assert MARCONI.by_recency(0.0) and not MARCONI.by_recency(1e-9)
    fixed = Score("fixed", terms=(Term(Feature.RECENCY), Term(Feature.EFFICIENCY, 1e-20)))
    assert not fixed.by_recency(0.0)
    fixed = Score("fixed", terms=(Term(Feature.RECENCY), Term(Feature.EFFICIENCY, 10.0)))
    assert not Score("eff", terms=(Term(Feature.EFFICIENCY, tuned=True),)).by_recency(0.0)
    effs = [0.5, 0.1, 0.3]
    state_order = StateOrder(PAPER_7B, fixed)
    state_order.eff_of = np.array(effs)
    found = {i: f"block {i}" for i in range(3)}
    assert state_order.pick(found, set()) == "block 1"  # the lowest efficiency, not the head
    assert StateOrder(PAPER_7B, MARCONI).pick(found, set()) == "block 0"  # alpha 0: the head


def test_a_declared_score_runs_compiled_where_its_form_maps() -> None:
    """A `Declared` score is the compiled core's `scored` evaluator, hit for hit and
    victim for victim the Python core's: Marconi's, and its declaration changed (three
    terms, fixed and tuned weights, the replay length and the inverse age)."""
    from marconi.core.cache import PrefixCache
    from marconi.core.compiled import CompiledCache, built, replay_cache
    from marconi.paper.admission import Judicious

    if not built():
        pytest.skip("the compiled core is not built")
    three = Score("three", terms=(Term(Feature.INVERSE_AGE, weight=0.5),
                                  Term(Feature.EFFICIENCY, weight=3.0, tuned=True),
                                  Term(Feature.REPLAY, weight=0.25)))
    for score in (MARCONI, TRIPLE, three, GREEDY_DUAL_FLOP, LEVELED):
        compiled = replay_cache(SMALL, "400KB", Judicious(), Declared(score, SMALL, 0.7))
        python = PrefixCache(SMALL, "400KB", Judicious(), Declared(score, SMALL, 0.7))
        assert isinstance(compiled, CompiledCache), score.name
        rng = np.random.default_rng(5)
        base = rng.integers(0, 1000, 300)
        for i in range(150):
            tokens = np.concatenate([base[:int(rng.integers(20, 300))],
                                     rng.integers(0, 1000, int(rng.integers(5, 60)))])
            n_input = len(tokens) - 3
            hits = [c.lookup(tokens[:n_input]).hit for c in (compiled, python)]
            assert hits[0] == hits[1], (score.name, i)
            for c in (compiled, python):
                c.commit(tokens, n_input)
            if score.leveled:  # the level each victim raised, bit for bit
                assert compiled.level == python.eviction.level, (score.name, i)  # type: ignore[attr-defined]
        assert compiled.stats.evictions == python.stats.evictions > 0, score.name
        assert compiled.stats.hit_tokens == python.stats.hit_tokens, score.name


def _engine_hits(system: str, capacity: str, core: str,
                 monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The hit per request of `system` at alpha 1, served, over an agent trace on `core`."""
    from marconi.core import compiled
    from marconi.sim import SimConfig, simulate
    from marconi.workload import TraceOptions, load_trace

    monkeypatch.setenv(compiled.CORE_ENV, core)
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, alpha=1.0,
                       bounds=False, replay="serving")
    result = simulate(trace, config)
    assert result.summary().to_json()["evictions"] > 0  # the capacity binds
    return [int(h) for h in result.records.hit]


# SGLang's states short of room (a small share of the memory): its state list gives victims
@pytest.mark.parametrize(("system", "capacity"), [
    ("vllm-2026+marconi", "2GB"), ("sglang-2026+marconi:mamba_full_memory_ratio=0.05", "1GB")])
def test_changing_marconis_declaration_reaches_the_engines_state_lists_on_both_cores(
        system: str, capacity: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines' emulations order their state lists by Marconi's declared score
    (`core.scores.ListScore`), which both cores evaluate: a changed declaration replays
    hit for hit on both, and differently from Marconi's."""
    from marconi.core import compiled

    cores = [c for c in compiled.CORES if c == "python" or compiled.built()]
    before = {core: _engine_hits(system, capacity, core, monkeypatch) for core in cores}
    monkeypatch.setattr(eviction, "MARCONI", TRIPLE)
    after = {core: _engine_hits(system, capacity, core, monkeypatch) for core in cores}
    for core in cores:
        assert before[core] == before["python"]
        assert after[core] == after["python"]
    assert after["python"] != before["python"]
    assert sum(after["python"]) > 0


@pytest.mark.parametrize("columns", [((0.3, 0.1, 0.9), (2.0, 2.0, 2.0)),
                                     ((5.0, 5.0, 5.0), (0.3, 0.1, 0.9)),
                                     ((1.0, 1.0), (4.0, 4.0)),
                                     ((0.3, 0.1, 0.9), (0.5, 0.7, 0.2))])
def test_two_terms_with_a_constant_column_are_numpys_bit_for_bit(columns) -> None:
    """`in_python`'s two-term path, each branch: either column constant (normalized to 1),
    both, neither; weights other than 1."""
    score = Score("two", terms=(Term(Feature.RECENCY, weight=0.85),
                                Term(Feature.EFFICIENCY, weight=3.0, tuned=True)))
    values = {Feature.RECENCY: list(columns[0]), Feature.EFFICIENCY: list(columns[1])}
    plain = evaluate(score, {f: np.array(v) for f, v in values.items()}, 0.7)
    assert in_python(score, values, 0.7) == plain.tolist()


def test_a_declared_score_keeps_its_alpha_and_only_the_books_it_reads() -> None:
    assert Declared(MARCONI, PAPER_7B, 0.7).alpha == 0.7
    assert Declared(MARCONI, PAPER_7B).alpha == 0.0  # tuned, no alpha given: 0
    recency = Declared(Score("recency", terms=(Term(Feature.RECENCY),)), PAPER_7B, 0.7)
    assert recency.alpha is None and recency.efficiency is None  # nothing tuned or read
    assert Declared(MARCONI, PAPER_7B).efficiency is not None
    with pytest.raises(ValueError) as refused:
        Declared(Score("leaves", terms=(Term(Feature.RECENCY),), candidates=Candidates.LEAVES))
    assert str(refused.value) == (
        "the Python core's Declared cannot evaluate score 'leaves': it runs candidates of "
        "at most one child and touches of the hit")
    with pytest.raises(ValueError) as missing:
        check_features(MARCONI, {Feature.INVERSE_AGE, Feature.REPLAY}, "who")
    assert str(missing.value) == ("who cannot evaluate score 'marconi': it reads efficiency, "
                                  "recency, and who computes only inverse-age, replay")


def test_marconi_plus_runs_its_flop_experts_declaration_on_both_cores() -> None:
    """marconi+'s live cache (`Switchable`) evaluates its FLOP expert's declared score in
    the compiled core too: GreedyDual-FLOP's declaration changed (`LEVELED`) runs there
    victim for victim and level for level as on the Python core, in its own mode and
    following (the level raised) while hit density chooses."""
    from marconi.core.cache import PrefixCache
    from marconi.core.compiled import CompiledCache, built, replay_cache
    from marconi.paper.admission import Judicious
    from marconi.plus.switchable import Mode, Setting, Switchable

    if not built():
        pytest.skip("the compiled core is not built")

    def live() -> Switchable:
        return Switchable(SMALL, Mode.FLOP, flop=Declared(LEVELED, SMALL), depth=False)

    compiled = replay_cache(SMALL, "2MB", Judicious(), live())
    python = PrefixCache(SMALL, "2MB", Judicious(), live())
    assert isinstance(compiled, CompiledCache)
    rng = np.random.default_rng(11)
    base = rng.integers(0, 1000, 300)
    levels = []
    for i in range(240):
        if i in (80, 160):  # hit density chooses, then the declared score again
            mode = Mode.DENSITY if i == 80 else Mode.FLOP
            for c in (compiled, python):
                c.eviction.set_setting(Setting(mode))
        tokens = np.concatenate([base[:int(rng.integers(20, 300))],
                                 rng.integers(0, 1000, int(rng.integers(5, 60)))])
        hits = [c.lookup(tokens[:-3]).hit for c in (compiled, python)]
        assert hits[0] == hits[1], i
        for c in (compiled, python):
            c.commit(tokens, len(tokens) - 3)
        assert compiled.level == python.eviction.flop.level, i  # type: ignore[attr-defined]
        levels.append(compiled.level)
    assert compiled.stats.evictions == python.stats.evictions > 100
    assert compiled.stats.hit_tokens == python.stats.hit_tokens
    assert levels[100] < levels[159]  # (hit density chose, and the level followed)


def test_greedy_duals_declaration_reaches_every_system_that_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing GreedyDual-FLOP's one declaration (`plus/greedy_dual.py`) reaches marconi+'s
    live cache and its FLOP experts' shadows, which the compiled core still runs."""
    from marconi.plus import greedy_dual
    from marconi.plus.switchable import Mode

    monkeypatch.setattr(greedy_dual, "GREEDY_DUAL_FLOP", LEVELED)
    for name in ("marconi+", "marconi+-gd", "marconi+-no-density"):
        admission, live = get_system(name).policies(PAPER_7B, 0.0)
        assert live.flop.score is LEVELED, name  # type: ignore[attr-defined]
        assert live.solo(Mode.FLOP).score is LEVELED, name  # type: ignore[attr-defined]
        assert compiled_reason(PAPER_7B, admission, live, Layout()) is None, name


def test_an_evaluated_score_is_a_fresh_array() -> None:
    """`evaluate` returns an array of its own (a victim choice overwrites the protected
    candidates' scores in it), an unnormalized term of weight 1 included."""
    column = np.array([3.0, 1.0, 2.0])
    for score in (Score("raw", terms=(Term(Feature.RECENCY),), normalized=False),
                  Score("raw2", terms=(Term(Feature.RECENCY), Term(Feature.REPLAY)),
                        normalized=False),
                  MARCONI):
        got = evaluate(score, {f: column for f in score.features}, 1.0)
        assert not np.shares_memory(got, column), score.name
