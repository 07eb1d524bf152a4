"""Declared placements (marconi.core.priority.Placement) run by `Placed` on the Python
core and by the compiled core: the paper's admissions are three declarations, and
changing one is one change that both cores follow, hit for hit."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core import compiled
from marconi.core.compiled import replay_cache
from marconi.core.integrity import check_integrity
from marconi.core.placement import Placed
from marconi.core.policy import Admission
from marconi.core.priority import Placement
from marconi.paper import admission as paper
from marconi.paper.eviction import LRULeaf
from marconi.systems import get_system
from marconi.workload import TraceOptions, load_trace
from tests.helpers import SMALL, serve

CORES = [c for c in compiled.CORES if c == "python" or compiled.built()]


def replay(core: str, admission: Admission, capacity: int,
           monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each request's hit, states admitted and the checkpoints its lookup planned, over a
    branching trace, on `core`."""
    monkeypatch.setenv(compiled.CORE_ENV, core)
    cache = replay_cache(SMALL, capacity, admission, LRULeaf())
    assert getattr(cache, "compiled", False) == (core == "compiled")
    trace = load_trace("synthetic:branching", options=TraceOptions(sessions=10))
    out = []
    for request in trace.requests:
        tokens = np.concatenate([request.input_tokens, request.output_tokens])
        before, n_input = cache.stats.states_admitted, len(request.input_tokens)
        plan = cache.lookup(tokens[:n_input])
        cache.commit(tokens, n_input)
        out.append((plan.hit, cache.stats.states_admitted - before,
                    tuple(int(p) for p in plan.checkpoints)))
        if getattr(cache, "compiled", False):
            cache.check()  # type: ignore[attr-defined]
        else:
            check_integrity(cache)
    return out


def test_the_papers_admissions_are_their_declarations() -> None:
    assert get_system("sglang+").policies(SMALL, 0.0)[0].placement is paper.JUDICIOUS
    assert get_system("marconi").policies(SMALL, 0.5)[0].placement is paper.JUDICIOUS
    assert get_system("vllm+").policies(SMALL, 0.0)[0].placement == paper.every_block(32)
    vanilla = get_system("vanilla").policies(SMALL, 0.0)[0]
    assert vanilla.placement is paper.NOTHING and not vanilla.caches


# the judicious placement changed: blocks of 256 tokens besides the branch point and end
BLOCKS_TOO = Placement("judicious-and-blocks", branch=True, every=256, end=True)
# each alone, and the end only
SHAPES = [Placement("branch", branch=True), Placement("blocks", every=200),
          Placement("end", end=True), BLOCKS_TOO, paper.NOTHING]


@pytest.mark.parametrize("capacity", [2_000_000, 10**12])
def test_changing_the_judicious_placement_is_one_change(
        capacity: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing `paper/admission.py`'s `JUDICIOUS` reaches sglang+ on both cores, which
    then replay as a `Placed` of the new declaration does, request for request."""
    before = {core: replay(core, paper.Judicious(), capacity, monkeypatch) for core in CORES}
    monkeypatch.setattr(paper, "JUDICIOUS", BLOCKS_TOO)
    admission = get_system("sglang+").policies(SMALL, 0.0)[0]
    assert admission.placement is BLOCKS_TOO
    after = {core: replay(core, admission, capacity, monkeypatch) for core in CORES}
    reference = replay("python", Placed(BLOCKS_TOO), capacity, monkeypatch)
    for core in CORES:
        assert after[core] == reference
        assert before[core] == before["python"]
    assert reference != before["python"]
    assert sum(run[0] for run in reference) > 0


@pytest.mark.parametrize("placement", SHAPES, ids=lambda p: p.name)
def test_both_cores_place_every_shape_alike(placement: Placement,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag alone, all together and none: the same hits and states on both cores."""
    runs = [replay(core, Placed(placement), 2_000_000, monkeypatch) for core in CORES]
    assert all(run == runs[0] for run in runs)
    assert (sum(run[1] for run in runs[0]) > 0) == placement.caches
    assert any(run[2] for run in runs[0]) == (placement.branch or placement.every > 0)


def test_a_final_partial_block_grows_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 32: a sequence of 100 tokens holds states at 32, 64, 96 and 100; extended
    to 150, the block [96, 100) grows to 128 (its state moves there), on both cores."""
    for core in CORES:
        monkeypatch.setenv(compiled.CORE_ENV, core)
        cache = replay_cache(SMALL, 10**12, paper.Block(32), LRULeaf())
        tokens = np.arange(150, dtype=np.int32)
        serve(cache, None, tokens[:100], 100)
        serve(cache, None, tokens, 150)
        states = [cache.lookup(tokens[:n]).hit for n in (100, 127, 128, 150)]
        assert states == [96, 96, 128, 150], core


def test_a_placement_is_checked() -> None:
    with pytest.raises(ValueError, match=r"placement 'p': every must be an integer >= 0"):
        Placement("p", every=-1)
    with pytest.raises(ValueError, match="every must be an integer"):
        Placement("p", every=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block size must be a positive integer"):
        paper.Block(0)
