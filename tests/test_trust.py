"""Figures that must never be silently wrong: refusals shown and warned about, latency
models that never predict nothing for work done, bounded bookkeeping."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.spec import PAPER_7B
from marconi.paper.eviction import LRULeaf
from marconi.peers.two_lists import TwoListLRU
from marconi.plus.switchable import Switchable
from marconi.report.grouping import refusal_note
from marconi.report.table import table
from marconi.sim.latency import ProfileLatency, nonnegative_fit
from marconi.sim.result import SimConfig
from marconi.sim.run import run
from marconi.sim.summary import Summary
from marconi.sim.warnings import refusal_warning
from marconi.systems import make_cache
from marconi.workload import load_trace
from tests.helpers import SMALL, ListStore


@pytest.fixture(scope="module")
def agent_runs() -> dict[str, Summary]:
    """vLLM+ keeps a state every 32 tokens: at 2 GB no agent call fits, all are refused."""
    trace = load_trace("synthetic:agent:sessions=10")
    return {s: run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system=s, bounds=False,
                                    replay="sequential"),
                   warn=False).summary() for s in ("vllm+", "sglang+")}


class TestRefusalsShown:
    def test_counts(self, agent_runs: dict[str, Summary]) -> None:
        vllm, sglang = agent_runs["vllm+"], agent_runs["sglang+"]
        assert vllm.commits == vllm.refused_commits == 200
        assert vllm.token_hit_rate == 0.0 and vllm.evictions == 0
        assert sglang.refused_commits == 0 and sglang.token_hit_rate > 0.4

    def test_table_has_a_refused_column(self, agent_runs: dict[str, Summary]) -> None:
        lines = table([agent_runs["vllm+"], agent_runs["sglang+"]]).splitlines()
        cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
        at = cells[0].index("refused")
        assert cells[2][at] == "200" and cells[3][at] == "0"

    def test_warning_above_one_percent(self, agent_runs: dict[str, Summary]) -> None:
        message = refusal_warning(agent_runs["vllm+"])
        assert message is not None and "refused 200 of 200 commits" in message
        assert refusal_warning(agent_runs["sglang+"]) is None
        some = agent_runs["sglang+"]
        assert refusal_warning(dataclasses.replace(some, commits=1000, refused_commits=10)) is None
        assert refusal_warning(dataclasses.replace(some, commits=1000, refused_commits=11))

    def test_run_warns_on_stderr(self, capsys: pytest.CaptureFixture[str]) -> None:
        trace = load_trace("synthetic:agent:sessions=2")
        run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system="vllm+", bounds=False))
        assert "warning: vllm+ refused" in capsys.readouterr().err

    def test_figure_note(self, agent_runs: dict[str, Summary]) -> None:
        rows = [dict(r.to_json(), dataset="agents") for r in agent_runs.values()]
        note = refusal_note(rows)
        assert "vllm+ on agents: 1 configuration(s), up to 100.0%" in note
        assert "sglang+" not in note and refusal_note(rows[1:]) == ""

    def test_plot_labels_name_refusals(self, agent_runs: dict[str, Summary]) -> None:
        from marconi.report.plot import _label

        assert _label(agent_runs["vllm+"].to_json()) == "vllm+\nrefused\n200/200"
        assert _label(agent_runs["sglang+"].to_json()) == "sglang+"


def test_warning_counts_arrays_too(agent_runs: dict[str, Summary]) -> None:
    assert refusal_warning(dataclasses.replace(agent_runs["sglang+"], commits=np.int64(10),
                                   refused_commits=np.int64(5)))


def _profile(tmp_path: Path, seconds: Callable[[float, float], float],
             lengths: Sequence[int] = (16, 64, 128, 256, 400, 624)) -> Path:
    path = tmp_path / "profile.csv"
    rows = [(t, c, seconds(t, c)) for t in lengths for c in (0, 100, 600)]
    path.write_text("tokens_to_prefill,cached_tokens,seconds\n"
                    + "\n".join(f"{t},{c},{s:.6f}" for t, c, s in rows))
    return path


class TestProfileLatency:
    def test_long_prefills_never_free(self, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
        """A concave profile measured to 624 tokens: an unconstrained quadratic turns
        negative past ~2,000 tokens; TTFT must still grow with the work."""
        model = ProfileLatency(_profile(tmp_path, lambda t, c: 0.005 + 4e-4 * t - 4e-7 * t * t),
                               PAPER_7B)
        t = np.array([1, 100, 624, 2000, 8000, 30000])
        ttft = model.ttft(t, np.zeros_like(t))
        assert (ttft > 0).all() and (np.diff(ttft) > 0).all()
        assert ttft[-1] / ttft[2] == pytest.approx(PAPER_7B.flops(30000) / PAPER_7B.flops(624))
        assert model.extrapolated == 3
        assert "3 of 6 requests prefill more" in capsys.readouterr().err

    @pytest.mark.parametrize("seed", range(5))
    def test_non_decreasing_in_tokens(self, tmp_path: Path, seed: int) -> None:
        rng = np.random.default_rng(seed)
        a, b, q, d = rng.uniform(-1e-3, 1e-3, 4)
        model = ProfileLatency(_profile(tmp_path, lambda t, c: abs(
            a + b * t + q * 1e-3 * t * t + d * 1e-3 * t * c + rng.normal(0, 1e-4))), PAPER_7B)
        assert (model.coef >= 0).all()
        for cached in (0, 300, 5000):
            t = np.arange(1, 3000, 7)
            ttft = model.ttft(t + cached, np.full_like(t, cached))
            assert (np.diff(ttft) >= 0).all() and (ttft > 0).all()

    @pytest.mark.parametrize(("seconds", "why"), [
        (0.0, "work done never takes 0 s"), (-0.01, "must be a finite number >= 0"),
        (float("inf"), "must be a finite number >= 0"), (float("nan"), "finite number")])
    def test_a_profile_of_free_or_broken_work_is_refused(self, tmp_path: Path, seconds: float,
                                                        why: str) -> None:
        path = _profile(tmp_path, lambda t, c: 0.001 * t)
        lines = path.read_text().splitlines()
        lines[3] = f"64,0,{seconds}"  # line 4 of the file
        path.write_text("\n".join(lines))
        with pytest.raises(ValueError, match=f"profile.csv, line 4: .*{why}"):
            ProfileLatency(path, PAPER_7B)

    def test_the_cli_extrapolates_by_the_models_flops(self, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
        import json

        from marconi.cli import main

        path = _profile(tmp_path, lambda t, c: 0.005 + 4e-4 * t)
        assert main(["simulate", "synthetic:agent", "--sessions", "2", "--system", "vanilla",
                     "--capacity", "0", "--latency-profile", str(path), "--json", "--quiet",
                     "--no-bounds"]) == 0
        cli = json.loads(capsys.readouterr().out)
        trace = load_trace("synthetic:agent:sessions=2")
        n = np.array([r.n_input for r in trace])
        by_flops = ProfileLatency(path, PAPER_7B).ttft(n, np.zeros_like(n))
        by_tokens = ProfileLatency(path).ttft(n, np.zeros_like(n))
        assert cli["ttft_p95"] == pytest.approx(float(np.percentile(by_flops, 95)))
        assert cli["ttft_p95"] != pytest.approx(float(np.percentile(by_tokens, 95)))

    def test_nonnegative_fit_is_least_squares_when_feasible(self) -> None:
        x = np.stack([np.ones(6), np.arange(6.0)], axis=1)
        assert nonnegative_fit(x, 2 + 3 * np.arange(6.0)) == pytest.approx([2, 3])
        assert nonnegative_fit(x, 5 - np.arange(6.0)) == pytest.approx([2.5, 0], abs=1e-9)


def _heaps(policy: object) -> list[tuple[int, int]]:
    """(entries, bound) of every lazy heap a policy keeps."""
    if isinstance(policy, Switchable):
        return _heaps(policy.lru)
    if isinstance(policy, LRULeaf):
        return [(len(policy._heap), 2 * len(policy.stamp) + 65)]
    assert isinstance(policy, TwoListLRU)
    return [(len(lru.heap), 2 * len(lru.stamps) + 65) for lru in (policy.kv, policy.states)]


@pytest.mark.parametrize("system", ["sglang+", "vllm+", "sglang-2026", "vllm-2026",
                                    "marconi+"])
def test_lazy_heaps_stay_bounded_without_evictions(system: str) -> None:
    """Every touch pushes a heap entry; with nothing evicted, stale ones must still go
    (they used to pile up by one or more per request, forever)."""
    cache = make_cache(SMALL, "1TB", system)
    prompts = [list(range(1000 * s, 1000 * s + 40)) for s in range(3)]
    for i in range(600):
        tokens = prompts[i % 3]
        cache.lookup(tokens)
        cache.commit([*tokens, 1], len(tokens))
    assert cache.stats.evictions == 0
    for entries, bound in _heaps(cache.eviction):
        assert entries <= bound, f"{system}: {entries} heap entries for {bound} allowed"


def test_state_handles_released_when_states_hold_no_bytes() -> None:
    """An attention-only model's checkpoints cost 0 bytes; their handles must still be
    given back to the store when their node leaves."""
    spec = dataclasses.replace(SMALL, ssm_layers=0)
    assert spec.ssm_bytes == 0
    store = ListStore()
    cache = make_cache(spec, 30 * spec.kv_bytes_per_token, "sglang+", store=store)
    for start in (0, 1000):
        tokens = list(range(start, start + 20))
        wanted = cache.required_states(tokens, 20)
        cache.commit(tokens, 20, states={p: ("state", start, p) for p in wanted}, kv=tokens)
    assert cache.stats.evictions == 1 and ("state", 0, 20) in store.released_states


class TestVllmPlusPartialBlock:
    def test_partial_block_grows_in_place(self) -> None:
        """As in the paper's artifact: a sequence that extends an earlier one's final
        partial block moves that block's state to its new end; no interior state stays
        behind at the old end, and nothing counts as an eviction."""
        store = ListStore()
        cache = make_cache(SMALL, "1TB", "vllm+", store=store)
        first = list(range(100))
        cache.commit(first, 100, states=_handles(cache, first), kv=first)
        assert _state_depths(cache) == [32, 64, 96, 100]
        second = [*first, *range(500, 550)]
        assert cache.lookup(second).hit == 100
        cache.commit(second, 150, states=_handles(cache, second), kv=second)
        assert _state_depths(cache) == [32, 64, 96, 128, 150]
        assert cache.stats.states_replaced == 1 and cache.stats.evictions == 0
        assert store.released_states == [("state", 100)]  # handed back to the engine
        spelled = [t for n in cache.path(cache.lookup([*second, 7]).node) for t in n.kv]
        assert spelled == second
        check_integrity(cache)

    def test_a_later_branch_splits_the_grown_block(self) -> None:
        cache = make_cache(SMALL, "1TB", "vllm+")
        first = list(range(100))
        cache.commit(first, 100)
        cache.commit([*first, 7, 8], 102)  # the partial block [96, 100) grows to 102
        cache.commit([*first, 9, 9, 9], 103)  # branches at 100: a stateless split there
        assert _state_depths(cache) == [32, 64, 96, 102, 103]
        assert cache.stats.states_replaced == 1
        assert cache.lookup([*first, 9]).hit == 96
        check_integrity(cache)


def _handles(cache: PrefixCache, tokens: list[int]) -> dict[int, tuple[str, int]]:
    return {p: ("state", p) for p in cache.required_states(tokens, len(tokens))}


def _state_depths(cache: PrefixCache) -> list[int]:
    return sorted(n.depth for n in cache.tree.nodes() if n.has_state)


class TestBoundsBudget:
    """The infinite-cache bounds hold every distinct prefix: past `bounds_tokens` a replay
    drops them and says so, instead of growing with the trace or reporting half a bound."""

    def test_seen_tree_counts_distinct_tokens(self) -> None:
        from marconi.sim.bounds import SeenTree

        seen = SeenTree()
        for tokens in ([1, 2, 3], [1, 2, 4, 5], [1, 2], [1, 2, 4, 5, 6]):
            seen.commit(np.array(tokens, dtype=np.int32), n_input=len(tokens))
        assert seen.tokens == 6  # 1 2 3 | 4 5 | 6

    def test_dropped_past_the_budget(self, capsys: pytest.CaptureFixture[str]) -> None:
        trace = load_trace("synthetic:agent:sessions=2")
        full = run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system="sglang+"))
        budget = int(trace[0].n_input + trace[0].n_output)  # the first request fills it
        small = run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system="sglang+",
                                     bounds_tokens=budget))
        err = capsys.readouterr().err
        summary, reference = small.summary().to_json(), full.summary().to_json()
        assert small.bounds_dropped == summary["bounds_dropped_at"] == 2
        assert "infinite-cache bounds dropped after 2 requests " in err
        assert "bound_token_hit_rate" not in summary and "miss_tokens" not in summary
        assert "bounds_dropped_at" not in reference and "miss_tokens" in reference
        assert summary["token_hit_rate"] == reference["token_hit_rate"]  # the replay itself

    def test_kept_within_the_budget(self) -> None:
        trace = load_trace("synthetic:agent:sessions=2")
        exact = sum(int(r.n_input + r.n_output) for r in trace)  # an upper bound
        result = run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system="sglang+",
                                      bounds_tokens=exact))
        assert result.bounds_dropped is None and "miss_tokens" in result.summary().to_json()


def test_sweep_rows_warn_with_their_cell(agent_runs: dict[str, Summary]) -> None:
    from marconi.sim.sweep import refusal_warnings

    cell = {"status": "ok", "system": "vllm+", "capacity": "1GB", "cell_id": "c1",
            "trace": "t.jsonl", "model": "paper-7b"}
    row = cell | agent_runs["sglang+"].to_row() | {"commits": 100.0, "refused_commits": 2.0}
    assert refusal_warnings([row]) == [
        "warning: vllm+ refused 2 of 100 commits (2.0%): sequences too big for a 1GB cache "
        "were not cached (cell c1, t.jsonl)"]
    assert refusal_warnings([row | {"refused_commits": 1}]) == []  # 1% is not above 1%
    assert refusal_warnings([row | {"status": "error"}]) == []
    assert refusal_warnings([row | {"commits": float("nan")}]) == []  # a resumed row's gap
    assert refusal_warnings([row | {"commits": None, "evicted_then_refused": None}]) == []
    dropped = refusal_warnings([row | {"refused_commits": 0, "bounds_dropped_at": 5000}])
    assert len(dropped) == 1 and "bounds dropped after 5,000 requests" in dropped[0]
    assert refusal_warnings([row | {"refused_commits": 0, "bounds_dropped_at": None}]) == []
    lost = refusal_warnings([row | {"refused_commits": 0, "evicted_then_refused": 3}])
    assert lost == ["warning: vllm+: 3 commits evicted entries and were refused all the same "
                    "(its eviction ran out of victims: a policy bug) (cell c1, t.jsonl)"]
    sampled = refusal_warnings([row | {"refused_commits": 0, "shadows_sampled_from": 20000,
                                       "shadows_sample_rate": 0.125}])
    assert len(sampled) == 1 and "from request 20,000 on, its shadow experts saw 12.5%" \
        in sampled[0] and sampled[0].endswith("(cell c1, t.jsonl)")
    assert refusal_warnings([row | {"refused_commits": 0,
                                    "shadows_sampled_from": float("nan")}]) == []


def test_a_policy_that_runs_out_is_reported() -> None:
    """An eviction that names no victim above the floor: the summary counts the commits
    that evicted (here: tried to) and were refused anyway, and the warning names them."""
    from marconi.paper.admission import Judicious
    from marconi.sim.replay import simulate
    from marconi.sim.warnings import policy_warning
    from marconi.systems import System

    class Stubborn(LRULeaf):
        def victim(self, protected, now):  # type: ignore[no-untyped-def]
            return None

    stubborn = System(name="sglang+", policies=lambda spec, alpha: (Judicious(), Stubborn()))
    trace = load_trace("synthetic:agent:sessions=2")
    config = SimConfig(spec=PAPER_7B, capacity="2GB", system="sglang+", bounds=False)
    summary = simulate(trace, config, system=stubborn).summary()
    assert summary.evicted_then_refused is not None and summary.evicted_then_refused > 0
    message = policy_warning(summary)
    assert message is not None and f"{summary.evicted_then_refused} commits evicted" in message
    healthy = simulate(trace, config).summary()
    assert healthy.evicted_then_refused == 0 and policy_warning(healthy) is None
