"""`Summary`: its JSON is the CLI contract, its row goes through a results file and back,
and every warning fires alike from a live summary and from a row read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi.core.spec import PAPER_7B
from marconi.sim.result import SimConfig
from marconi.sim.results_file import ResultsFile
from marconi.sim.run import run
from marconi.sim.summary import Summary, Tuning
from marconi.sim.sweep import refusal_warnings
from marconi.sim.warnings import run_warnings
from marconi.workload import load_trace

# `marconi simulate --json` of a run with bounds and a tuner, key by key in order
# (docs/architecture.md, "Metrics": other tools rely on these keys)
JSON_KEYS = [
    "system", "replay", "trace", "requests", "input_tokens", "hit_tokens", "token_hit_rate",
    "request_hit_rate", "flops_saved", "flops_total", "flops_saved_rate", "alpha",
    "alpha_status", "states_admitted", "states_evicted", "evictions", "commits",
    "refused_commits", "evicted_then_refused", "peak_bytes", "capacity", "model", "page_size",
    "state_slots", "seconds", "ttft_p5", "ttft_p50", "ttft_p95", "ttft_mean", "kv_bytes_mean",
    "ssm_bytes_mean", "kv_bytes_final", "ssm_bytes_final", "bound_token_hit_rate",
    "system_bound_token_hit_rate", "miss_tokens", "reuse_taxonomy", "hit_rate_by_input_length",
    "tuning"]
# what each run of `runs` warns of (the "lost" one: evicted, then refused)
WANTED = {"bootstrap": ("refused 7 of 80 commits",
                        "window of 75 requests, from the first eviction at request 15"),
          "dropped": ("bounds dropped after 2 requests",), "sampled": ("from request 20 on",),
          "idle": ("never evicted",), "lost": ("refused all the same",),
          "served": ("ran without holding it", "raise --capacity")}
# a cell's columns
CELL = ("system", "replay", "trace", "capacity", "model", "page_size", "state_slots")


def _summary(system: str, capacity: str = "1GB", **config: Any) -> Summary:
    trace = load_trace("synthetic:agent:sessions=4")
    config = {"replay": "sequential"} | config
    return run(trace, SimConfig(spec=PAPER_7B, capacity=capacity, system=system, **config),
               warn=False).summary()


@pytest.fixture(scope="module")
def runs() -> dict[str, Summary]:
    """One run per shape of summary, each calling for one warning or note."""
    return {"bootstrap": _summary("marconi"),  # bounds; refuses > 1%; its window outlasts
            # the trace
            "dropped": _summary("sglang+", capacity="20GB", bounds_tokens=3000),
            "sampled": _summary("marconi+", capacity="20GB", bounds=False,
                                shadow_sample_after=20),
            "idle": _summary("marconi", capacity="20GB"),  # never evicts, never tunes
            # served; some requests too large to hold their memory beside the cache
            "served": _summary("sglang+", capacity="1GB", replay="serving")}


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """The reference flattening of the JSON into a row, written out by hand."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in CELL or key in ("hit_rate_by_input_length", "reuse_taxonomy", "engine"):
            continue
        if key == "miss_tokens":
            out |= {f"miss_{k}": v for k, v in value.items()}
        elif key == "tuning":
            out |= {"tuned_alpha": value.get("alpha"), "tuning_window": value.get("window"),
                    "tuning_n0": value.get("n0")}
            if value.get("sampled_from") is not None:
                out |= {"shadows_sampled_from": value["sampled_from"],
                        "shadows_sample_rate": value["sample_rate"]}
        elif key == "served":
            out |= {f"served_{k}": v for k, v in value.items()}
        elif key == "experts":
            out["experts_saved"] = json.dumps(value["saved"])
            out |= {f"experts_{k}": v for k, v in value.items() if k != "saved"}
        else:
            out[key] = value
    return out


def _cell(summary: Summary, name: str) -> dict[str, Any]:
    return {"cell_id": name, "status": "ok", "error": "", "system": summary.system,
            "replay": summary.replay, "trace": summary.trace, "capacity": "1GB",
            "model": summary.model}


def _as_read_back(summary: Summary) -> Summary:
    """What a row keeps of `summary`: its scalars, the cell's capacity text."""
    bounds = summary.bounds and dataclasses.replace(summary.bounds, reuse_taxonomy=None)
    tuning = summary.tuning and dataclasses.replace(summary.tuning, report=None)
    return dataclasses.replace(
        summary, capacity="1GB", page_size=None, state_slots=None, bounds=bounds,
        hit_rate_by_input_length=None, engine=None,
        tuning=None if tuning == Tuning() else tuning)


class TestJson:
    def test_keys_are_the_contract(self, runs: dict[str, Summary]) -> None:
        assert list(runs["bootstrap"].to_json()) == JSON_KEYS
        dropped = list(runs["dropped"].to_json())
        assert dropped == [*JSON_KEYS[:33], "bounds_dropped_at", "hit_rate_by_input_length"]
        assert list(runs["sampled"].to_json()) == [*JSON_KEYS[:33], *JSON_KEYS[-2:], "experts"]
        assert list(runs["served"].to_json()) == [*JSON_KEYS[:-1], "served"]
        assert list(runs["served"].to_json()["served"]) == [
            "waited", "max_running", "unreserved", "makespan_s", "ttft_p50", "ttft_p95"]

    def test_nested_parts(self, runs: dict[str, Summary]) -> None:
        out = runs["bootstrap"].to_json()
        assert list(out["miss_tokens"]) == ["cold", "not_admitted", "evicted"]
        assert list(out["reuse_taxonomy"]) == ["purely_input", "input_and_output", "none"]
        assert list(out["hit_rate_by_input_length"][0]) == ["min_tokens", "max_tokens",
                                                            "requests", "token_hit_rate"]
        assert list(out["tuning"]) == ["n0", "window", "alpha", "scores", "adopted", "restored"]
        assert sum(out["miss_tokens"].values()) == out["input_tokens"] - out["hit_tokens"]

    def test_row_is_the_json_flattened(self, runs: dict[str, Summary]) -> None:
        for summary in runs.values():
            row = summary.to_row()
            assert row == _flat(summary.to_json())
            assert list(row) == list(_flat(summary.to_json()))


class TestRowsReadBack:
    @pytest.mark.parametrize("suffix", [".csv", ".parquet"])
    def test_round_trip(self, runs: dict[str, Summary], tmp_path: Path, suffix: str) -> None:
        """Rows of every shape in one file (so each lacks some columns: gaps) come back
        as the summaries they were written from, less what a row does not keep."""
        store = ResultsFile(tmp_path / f"sweep{suffix}")
        store.write([_cell(s, name) | s.to_row() for name, s in runs.items()])
        back = {row["cell_id"]: Summary.from_row(row) for row in store.read()}
        for name, summary in runs.items():
            assert back[name] == _as_read_back(summary), name

    @pytest.mark.parametrize("suffix", [".csv", ".parquet"])
    def test_nan_gaps_read_as_none(self, runs: dict[str, Summary], tmp_path: Path,
                                   suffix: str) -> None:
        summary = runs["bootstrap"]
        nan = float("nan")
        gaps = {"commits": nan, "evicted_then_refused": nan, "alpha": nan,
                "kv_bytes_final": nan, "ssm_bytes_final": nan}
        store = ResultsFile(tmp_path / f"gaps{suffix}")
        store.write([_cell(summary, "c") | summary.to_row() | gaps])
        (row,) = store.read()
        back = Summary.from_row(row)
        assert (back.commits, back.evicted_then_refused, back.alpha) == (None, None, None)
        assert back.kv_bytes_final is None and back.ssm_bytes_final is None
        assert back.requests == summary.requests
        assert Summary.from_row(row | {"bounds_dropped_at": np.float64(nan)}).bounds_dropped_at \
            is None

    def test_a_missing_figure_is_an_error(self, runs: dict[str, Summary]) -> None:
        row = _cell(runs["bootstrap"], "c") | runs["bootstrap"].to_row()
        for gap in (None, float("nan"), ""):
            with pytest.raises(ValueError, match="'requests'"):
                Summary.from_row(row | {"requests": gap})


class TestWarningsFromRows:

    @pytest.mark.parametrize("suffix", [".csv", ".parquet"])
    def test_each_fires_from_a_read_back_row(self, runs: dict[str, Summary], tmp_path: Path,
                                             suffix: str) -> None:
        """The live summary's warnings, word for word, from its row in a results file."""
        lost = dataclasses.replace(runs["sampled"], evicted_then_refused=3)
        summaries = runs | {"lost": lost}
        store = ResultsFile(tmp_path / f"sweep{suffix}")
        store.write([_cell(s, name) | s.to_row() for name, s in summaries.items()])
        rows = {row["cell_id"]: row for row in store.read()}
        for name, summary in summaries.items():
            live = run_warnings(dataclasses.replace(summary, capacity="1GB"))
            said = refusal_warnings([rows[name]])
            assert said == [f"{m} (cell {name}, {summary.trace})" for m in live], name
            assert all(any(part in m for m in said) for part in WANTED[name]), (name, said)
