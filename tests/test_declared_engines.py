"""A declared priority (`core.priority.Priority`) evaluated inside the engines' own cache
code by their plugins (`integration=NAME`, docs/integrations.md, "Declared priorities in
the engines"): in SGLang as the eviction strategy of its name, in vLLM as the order of its
Mamba states. Every registered system whose eviction is a declared priority is covered by
name from the registry, so a new one needs no test code here.

The engine tests need the engines' environments (`bash scripts/setup-peers.sh`): they
skip without them, except under CI (CI=true), where they fail."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.priority import Feature, Key, Priority, Term
from marconi.core.spec import PAPER_7B
from marconi.engine_flags import SGLANG_EVICTIONS
from marconi.engines.integrations.common import IntegrationError, check_policy, declared_priorities
from marconi.engines.integrations.common import declared_priority as priority_of
from marconi.engines.integrations.vllm.order import DeclaredStates
from marconi.engines.real.envs import PeerError
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.systems import get_system
from tests.test_realpeers import need

PRIORITIES = declared_priorities()


def test_the_registry_declares_lfu_and_slru() -> None:
    assert {"lfu", "slru"} <= set(PRIORITIES)
    assert priority_of("marconi") is None and priority_of("no-such-system") is None
    assert priority_of("sglang-0.5.23") is None  # a real engine declares nothing here


def test_an_unknown_policy_is_refused_with_what_is_allowed() -> None:
    with pytest.raises(IntegrationError, match=r"unknown policy 'lfx'.*allowed: marconi, "
                                               r"marconi\+, .*lfu.*slru"):
        check_policy("who", "lfx")


def test_a_declared_priority_cannot_replace_another_eviction() -> None:
    with pytest.raises(PeerError, match="integration=lfu is the eviction order; "
                                        "eviction=slru would be replaced"):
        run(_small(), SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False,
                                system="sglang-0.5.23:integration=lfu,eviction=slru",
                                replay="sequential"))


def test_an_unknown_integration_is_refused_before_the_worker_starts() -> None:
    with pytest.raises(PeerError, match="unknown policy 'lfx' \\(option integration\\)"):
        run(_small(), SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False,
                                system="vllm-0.32:integration=lfx", replay="sequential"))


class TestDeclaredStates:
    """vLLM's states under a declaration, on the books its hooks keep: three states cached
    in order a, b, c, in the free queue in that order (a least recently used), hit 3, 0
    and 1 times."""

    def _order(self, name: str) -> tuple[DeclaredStates, dict[int, SimpleNamespace]]:
        order = DeclaredStates(PAPER_7B, priority_of(name))
        order.size(8)
        blocks = {i: SimpleNamespace(block_id=i) for i in range(3)}
        for i, state in enumerate((b"a", b"b", b"c")):
            order.note(i, state, order.above_of(100 * (i + 1), 0))
        for hits, i in ((3, 0), (1, 2)):
            for _ in range(hits):
                order.touched([blocks[i]])
        return order, blocks

    def test_lfu_takes_the_least_hit_then_the_least_recently_used(self) -> None:
        order, blocks = self._order("lfu")
        assert order.counts_hits and not order.by_recency()
        assert order.pick(blocks, set()) is blocks[1]  # hit never
        assert order.pick(blocks, {1}) is blocks[2]  # hit once, before a's three
        assert order.first(list(blocks.values()), None) == 1

    def test_slru_takes_probation_first_then_the_protected_by_recency(self) -> None:
        order, blocks = self._order("slru")
        assert order.pick(blocks, set()) is blocks[1]  # 1 hit in all: probationary
        assert order.pick(blocks, {1}) is blocks[0]  # a and c protected: a is older

    def test_a_block_cached_again_for_another_state_starts_unhit(self) -> None:
        order, blocks = self._order("lfu")
        order.note(0, b"d", order.above_of(50, 0))  # block 0 now holds state d
        assert order.pick(blocks, set()) is blocks[0]  # d: never hit, first in the queue
        order.forget(0)
        assert 0 not in order.hits and b"d" not in order.created
        order.clear()
        assert not order.hits and not order.created and not order.state_of

    def test_its_features_are_every_one_a_priority_reads(self) -> None:
        order, _ = self._order("lfu")
        assert set(order.key_values(0, 0)) == {Feature.RECENCY, Feature.HITS,
                                               Feature.CREATED, Feature.DEPTH,
                                               Feature.STATE}


# declarations whose last key is recency alone (the free queue's order: `_lowest`'s fast
# path) and others (the generic keys), over every feature, with weights and steps
SHAPES = [
    Priority("hits-depth", keys=(Key(Term(Feature.HITS), Term(Feature.DEPTH, -0.01)),
                                 Key(Term(Feature.RECENCY, 2.0)))),
    Priority("stepped", keys=(Key(Term(Feature.HITS, at_least=3)),
                              Key(Term(Feature.CREATED, -1.0), Term(Feature.STATE)),
                              Key(Term(Feature.RECENCY)))),
    Priority("created-last", keys=(Key(Term(Feature.HITS)), Key(Term(Feature.CREATED)))),
    Priority("recency-step", keys=(Key(Term(Feature.RECENCY, at_least=4)),
                                   Key(Term(Feature.RECENCY)))),
]


@pytest.mark.parametrize("priority", [*(priority_of(n) for n in PRIORITIES), *SHAPES],
                         ids=lambda p: p.name)
def test_the_lowest_is_the_lowest_of_the_declared_keys(priority: Priority) -> None:
    """`DeclaredStates` picks, over random books, the candidate whose full key (every
    declared key over every feature, then the caching order) is lowest, the first in the
    free queue among equals, whichever way it computes it."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        order = DeclaredStates(PAPER_7B, priority)
        order.size(64)
        n = int(rng.integers(2, 40))
        ids = [int(i) for i in rng.permutation(60)[:n]]
        for i in rng.permutation(ids).tolist():  # cached in another order than the queue's
            order.note(i, bytes([i, trial % 7]), order.above_of(int(rng.integers(1, 9)) * 64, 0))
        for i in ids:
            order.touched([SimpleNamespace(block_id=i)] * int(rng.integers(0, 5)))
        keys = [order.key(i, rank) for rank, i in enumerate(ids)]
        found = {i: SimpleNamespace(block_id=i) for i in ids}
        assert order.pick(found, set()) is found[ids[keys.index(min(keys))]]
        assert order.first([found[i] for i in ids], None) == keys.index(min(keys))


@pytest.fixture(scope="module")
def chat():
    from marconi.workload import TraceOptions, load_trace

    return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=40))


def _replay(trace, system: str, capacity: str = "1GB"):
    from marconi.sim.real_engine import replay

    config = SimConfig(replay="sequential", spec=PAPER_7B, capacity=capacity, bounds=False,
                       system=system)
    return replay(trace, config, get_system(system), check=True)


@pytest.mark.parametrize("name", PRIORITIES)
def test_sglang_runs_the_declaration_as_its_strategy(chat, name: str) -> None:
    """SGLang's Full walk asks the declaration's keys (its integrity checks after every
    request); where SGLang ships a strategy of that name, the declaration is it: the same
    hits, request for request."""
    need("sglang")
    ours = _replay(chat, f"sglang-0.5.23:integration={name}")
    hook = ours.summary().to_json()["engine"]["integration"]
    assert hook["policy"] == name and hook["keys"] > 0 and ours.stats.evictions > 0
    assert hook["alpha_status"] == "fixed"
    if name in SGLANG_EVICTIONS:
        theirs = _replay(chat, f"sglang-0.5.23:eviction={name}")
        assert (ours.records.hit == theirs.records.hit).all()


@pytest.mark.parametrize("engine", ["vllm-0.32", "vllm-0.34"])
@pytest.mark.parametrize("name", PRIORITIES)
def test_vllm_orders_its_states_by_the_declaration(chat, name: str, engine: str) -> None:
    """vLLM's pool checked after every request; each victim also chosen the plain way
    (`DeclaredStates.first` over the free states as the blocks say) and equal; the
    oldest and the newest version the plugin supports."""
    need(engine.removesuffix("-0.32"))  # (environments: vllm, vllm-0.33, vllm-0.34)
    ours = _replay(chat, f"{engine}:integration={name}")
    hook = ours.summary().to_json()["engine"]["integration"]
    assert hook["policy"] == name and hook["victims"] > 0 and hook["checked"] > 0
    assert hook["orphans"] == 0  # cached KV left in vLLM's order


def _small():
    from marconi.workload import load_trace

    return load_trace("synthetic:multi-turn:sessions=3")
