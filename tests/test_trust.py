"""Figures that must never be silently wrong: refusals shown and warned about, latency
models that never predict nothing for work done, bounded bookkeeping."""

from __future__ import annotations

import re

import numpy as np
import pytest

from marconi.core.spec import PAPER_7B
from marconi.report.grouping import refusal_note
from marconi.report.table import table
from marconi.sim.result import SimConfig, refusal_warning
from marconi.sim.run import run
from marconi.workload import load_trace


@pytest.fixture(scope="module")
def agent_runs() -> dict[str, dict]:
    """vLLM+ keeps a state every 32 tokens: at 2 GB no agent call fits, all are refused."""
    trace = load_trace("synthetic:agent:sessions=10")
    return {s: run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system=s, bounds=False),
                   warn=False).summary() for s in ("vllm+", "sglang+")}


class TestRefusalsShown:
    def test_counts(self, agent_runs: dict[str, dict]) -> None:
        vllm, sglang = agent_runs["vllm+"], agent_runs["sglang+"]
        assert vllm["commits"] == vllm["refused_commits"] == 200
        assert vllm["token_hit_rate"] == 0.0 and vllm["evictions"] == 0
        assert sglang["refused_commits"] == 0 and sglang["token_hit_rate"] > 0.4

    def test_table_has_a_refused_column(self, agent_runs: dict[str, dict]) -> None:
        lines = table([agent_runs["vllm+"], agent_runs["sglang+"]]).splitlines()
        cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
        at = cells[0].index("refused")
        assert cells[2][at] == "200" and cells[3][at] == "0"

    def test_warning_above_one_percent(self, agent_runs: dict[str, dict]) -> None:
        message = refusal_warning(agent_runs["vllm+"])
        assert message is not None and "refused 200 of 200 commits" in message
        assert refusal_warning(agent_runs["sglang+"]) is None
        assert refusal_warning({"system": "x", "commits": 1000, "refused_commits": 10}) is None
        assert refusal_warning({"system": "x", "commits": 1000, "refused_commits": 11})

    def test_run_warns_on_stderr(self, capsys: pytest.CaptureFixture[str]) -> None:
        trace = load_trace("synthetic:agent:sessions=2")
        run(trace, SimConfig(spec=PAPER_7B, capacity="2GB", system="vllm+", bounds=False))
        assert "warning: vllm+ refused" in capsys.readouterr().err

    def test_figure_note(self, agent_runs: dict[str, dict]) -> None:
        rows = [dict(r, dataset="agents") for r in agent_runs.values()]
        note = refusal_note(rows)
        assert "vllm+ on agents: 1 configuration(s), up to 100.0%" in note
        assert "sglang+" not in note and refusal_note(rows[1:]) == ""

    def test_plot_labels_name_refusals(self, agent_runs: dict[str, dict]) -> None:
        from marconi.report.plot import _label

        assert _label(agent_runs["vllm+"]) == "vllm+\nrefused 200/200"
        assert _label(agent_runs["sglang+"]) == "sglang+"


def test_warning_counts_arrays_too() -> None:
    assert refusal_warning({"system": "x", "commits": np.int64(10), "refused_commits": 5})
