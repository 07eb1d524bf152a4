"""Engine timings count what the cache costs, split prefills included, and engine-bench
reports speedup and overhead as shares of time to first token."""

from __future__ import annotations

import dataclasses

import numpy as np

from marconi.engines.hf import Engine
from marconi.engines.hf.bench import Row, format_table


def _prompt(n: int = 320) -> np.ndarray:
    return (np.arange(n) * 7 % 256).astype(np.int32)


class TestSplitPrefill:
    def test_a_split_prefill_counts_its_pieces_and_their_cost(self, get_model):
        engine = Engine(get_model("bamba"), "vllm+", measure_split=True)
        t = engine.generate(_prompt(), output=np.array([1, 2], dtype=np.int32)).timings
        assert t.segments == 10  # a state every 32 tokens: 32, 64, ..., 320
        assert 0 < t.split < t.prefill
        assert t.overhead_in_ttft == t.lookup + t.restore + t.split + t.snapshot
        assert t.overhead >= t.overhead_in_ttft + t.commit

    def test_one_piece_costs_nothing_extra(self, get_model):
        engine = Engine(get_model("bamba"), "vanilla", measure_split=True)
        t = engine.generate(_prompt(), output=np.array([1], dtype=np.int32)).timings
        assert (t.segments, t.split) == (1, 0.0)

    def test_serving_does_not_pay_for_the_measurement(self, get_model):
        engine = Engine(get_model("bamba"), "vllm+")
        t = engine.generate(_prompt(), output=np.array([1], dtype=np.int32)).timings
        assert t.segments == 10 and t.split == 0.0


def _row(system: str, ttft: float, split: float = 0.0) -> Row:
    return Row("conversation", system, 8, 1000, 0 if system == "vanilla" else 800,
               (1.0, 2.0, 3.0), 0, ttft, 1.0, 1.0, split, 5.0, 2.0)


def test_the_table_reports_shares_against_vanilla():
    table = format_table([_row("vanilla", 100.0), _row("vllm+", 177.0, split=70.0),
                          _row("sglang+", 40.0)]).splitlines()
    assert "vs_vanilla" in table[0] and "overhead" in table[0]
    vllm, sglang = table[2].split(), table[3].split()
    assert "+77.0%" in vllm and f"{100 * 77 / 177:.1f}%" in vllm  # split counted
    assert "-60.0%" in sglang and f"{100 * 7 / 40:.1f}%" in sglang


def test_repeated_runs_give_the_median_change_and_its_range():
    """Three repetitions: each change is against the same repetition's vanilla run, the
    table gives the median and the lowest..highest, and the median run's other figures."""
    rows = [dataclasses.replace(_row(system, ttft), repeat=k)
            for k, pairs in enumerate([(("vanilla", 100.0), ("sglang+", 40.0)),
                                       (("vanilla", 200.0), ("sglang+", 60.0)),
                                       (("vanilla", 100.0), ("sglang+", 90.0))])
            for system, ttft in pairs]
    table = format_table(rows).splitlines()
    assert "vs_range" in table[0] and len(table) == 3  # one line per (workload, system)
    sglang = table[2].split()
    assert "-60.0%" in sglang and "-70..-10%" in sglang  # -60, -70, -10: median -60
    assert f"{100 * 7 / 60:.1f}%" in sglang  # the median run's (60 ms) overhead share
