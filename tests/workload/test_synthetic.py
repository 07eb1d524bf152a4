from __future__ import annotations

import itertools

import numpy as np
import pytest

from marconi.workload import FORMATS, TraceOptions, load_trace
from marconi.workload.synthetic import GENERATORS

NAMES = sorted(f"synthetic:{g}" for g in GENERATORS)


def _prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n


class TestGenerators:
    @pytest.mark.parametrize("name", NAMES)
    def test_deterministic_by_seed_and_sorted(self, name: str) -> None:
        opts = TraceOptions(sessions=8)
        one, two = load_trace(name, options=opts), load_trace(name, options=opts)
        other = load_trace(name, options=opts.with_(seed=7))
        assert len(one) > 0 and name in FORMATS
        assert all(np.array_equal(a.tokens(), b.tokens()) for a, b in zip(one, two, strict=True))
        assert not all(
            np.array_equal(a.tokens(), b.tokens()) for a, b in zip(one, other, strict=False)
        )
        assert [r.arrival for r in one] == sorted(r.arrival for r in one)

    def test_params_from_name_suffix(self) -> None:
        trace = load_trace("synthetic:system-prompt:prompts=1,prompt_len=300,sessions=5")
        assert len(trace) == 5
        assert all(_prefix(trace[0].input_tokens, r.input_tokens) >= 300 for r in trace)

    def test_unknown_parameter(self) -> None:
        with pytest.raises(ValueError, match="unknown parameter 'bogus'"):
            load_trace("synthetic:rag:bogus=1")

    def test_twice_prefixes_appear_exactly_twice(self) -> None:
        trace = load_trace("synthetic:twice:sessions=10,prefix_len=100,distance=3")
        heads = [tuple(r.input_tokens[:100].tolist()) for r in trace]
        assert len(heads) == 10 and all(heads.count(h) == 2 for h in heads)

    def test_rag_has_partial_overlaps(self) -> None:
        trace = load_trace("synthetic:rag:sessions=30,docs=20,doc_len=50,system_len=10")
        shared = [_prefix(a.input_tokens, b.input_tokens) for a, b in itertools.pairwise(trace)]
        assert any(s >= 60 for s in shared) and any(10 <= s < 60 for s in shared)

    def test_branches_share_history_up_to_the_edit(self) -> None:
        trace = load_trace("synthetic:branching:sessions=1,branches=3,turns=5")
        base = sorted((r for r in trace if r.session_id == "conv0"), key=lambda r: r.turn)
        branches = [r for r in trace if r.session_id.startswith("conv0/b") and r.turn == 0]
        assert len(base) == 5 and len(branches) == 3
        for r in branches:
            assert _prefix(r.input_tokens, base[-1].tokens()) < r.n_input

    def test_agent_history_is_prefix(self) -> None:
        trace = load_trace("synthetic:agent:sessions=2,steps=5")
        reqs = sorted((r for r in trace if r.session_id == "agent0"), key=lambda r: r.turn)
        assert len(reqs) == 5
        for a, b in itertools.pairwise(reqs):
            assert np.array_equal(b.input_tokens[: a.n_input + a.n_output], a.tokens())
