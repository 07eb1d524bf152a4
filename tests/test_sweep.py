from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from marconi.commands.sweep import coerce
from marconi.sim.result import OFFLINE, REFERENCES
from marconi.sim.results_file import ResultsFile
from marconi.sim.sweep import Cell, expand, run_cell, run_sweep
from tests.helpers import CACHES

VOLATILE = ("seconds", "wall_s")  # timings: the only fields allowed to differ between runs
TRACE = "synthetic:multi-turn"


def _grid(**extra: Any) -> dict[str, Any]:
    return {"trace": TRACE, "sessions": 6, "system": ["sglang+", "marconi"],
            "capacity": ["300MB", "1GB"], **extra}


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without timings, in cell id order (the file holds them in completion order)."""
    return sorted(({k: v for k, v in r.items() if k not in VOLATILE} for r in rows),
                  key=lambda r: r["cell_id"])


class CountingExecutor(Executor):
    """Runs in threads and counts submissions (to prove finished cells are skipped)."""

    def __init__(self) -> None:
        self.pool, self.submitted = ThreadPoolExecutor(2), 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return self.pool.submit(fn, *args, **kwargs)


class TestCell:
    def test_id_is_stable_and_distinct(self) -> None:
        a = Cell.of(trace=TRACE, system="marconi", capacity="1GB")
        assert a.cell_id == Cell.of(capacity="1GB", system="marconi", trace=TRACE).cell_id
        assert a.cell_id != Cell.of(trace=TRACE, system="marconi", capacity="2GB").cell_id
        assert a.cell_id != Cell.of(trace=TRACE, system="marconi", capacity="1GB", sps=2.0).cell_id
        assert len(a.cell_id) == 16

    def test_expand_is_a_product(self) -> None:
        cells = expand(_grid(sps=[0.5, 1.0, 2.0]))
        assert len(cells) == 2 * 2 * 3
        assert len({c.cell_id for c in cells}) == len(cells)

    @pytest.mark.parametrize("grid", [{"trace": TRACE, "system": "nope", "capacity": "1GB"},
                                      {"trace": TRACE, "system": "marconi", "capacity": "1XB"},
                                      {"trace": TRACE, "system": "marconi", "capacity": "1GB",
                                       "colour": "red"},
                                      {"trace": TRACE, "system": "marconi", "capacity": "1GB",
                                       "model": "paper-7b,ssm=x"}])
    def test_bad_grids_raise(self, grid: dict[str, Any]) -> None:
        with pytest.raises(ValueError):
            expand(grid)

    def test_every_registered_system_runs(self) -> None:
        for name in CACHES:
            row = run_cell(Cell.of(trace=TRACE, sessions=3, system=name, capacity="1GB"))
            assert row["status"] == "ok", row["error"]
            assert 0 <= row["token_hit_rate"] <= 1
            assert row["system"] == name and row["alpha_fixed"] is None
            if row["alpha_status"] is None:  # no alpha: none reported, never 0.0
                assert row["alpha"] is None, (name, row["alpha"])

    def test_the_references_run_and_offline_leads(self) -> None:
        rows = {name: run_cell(Cell.of(trace=TRACE, sessions=6, system=name, capacity="300MB",
                                       replay="sequential"))
                for name in ("sglang+", *REFERENCES)}
        assert all(row["status"] == "ok" for row in rows.values()), rows
        assert rows[OFFLINE]["flops_saved"] >= rows["sglang+"]["flops_saved"]

    def test_coerce_follows_field_types(self) -> None:
        assert coerce("sessions", "none") is None
        assert coerce("sps", "0.5") == 0.5
        assert coerce("multiplier", "15") == 15
        assert coerce("records", "true") is True
        with pytest.raises(ValueError):
            coerce("sps", "fast")


class TestResultsFile:
    @pytest.mark.parametrize("suffix", [".csv", ".parquet"])
    def test_round_trip(self, tmp_path: Path, suffix: str) -> None:
        rows = [{"cell_id": "0123456789012345", "status": "ok", "alpha_fixed": None, "x": 1.5,
                 "n": 3, "flag": True, "error": ""},
                {"cell_id": "abcdef0123456789", "status": "error", "error": "boom"}]
        store = ResultsFile(tmp_path / f"r{suffix}")
        store.write(rows)
        back = store.read()
        assert back[0]["cell_id"] == "0123456789012345"  # ids stay text
        assert back[0]["x"] == 1.5 and back[0]["n"] == 3 and back[0]["alpha_fixed"] is None
        assert back[1]["error"] == "boom" and back[1].get("x") is None
        assert [p.name for p in tmp_path.iterdir()] == [f"r{suffix}"]  # no temp file left

    def test_bad_suffix(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError):
            ResultsFile(tmp_path / "r.txt")


class TestRunSweep:
    def test_rows_and_resume(self, tmp_path: Path) -> None:
        cells, out = expand(_grid()), tmp_path / "sweep.csv"
        first = run_sweep(cells, out, workers=2, progress=False)
        assert [r["cell_id"] for r in first] == [c.cell_id for c in cells]
        assert all(r["status"] == "ok" for r in first)
        counting = CountingExecutor()
        again = run_sweep(cells, out, executor=counting, progress=False)
        assert counting.submitted == 0
        assert again == first  # the very same rows, timings included: nothing reran
        assert _stable(ResultsFile(out).read()) == _stable(first)

    def test_failed_cell_is_recorded_and_retried(self, tmp_path: Path) -> None:
        good = expand(_grid())
        bad = Cell.of(trace=str(tmp_path / "missing.jsonl"), system="marconi", capacity="1GB")
        rows = run_sweep([*good, bad], tmp_path / "s.parquet", workers=2, progress=False)
        assert [r["status"] for r in rows] == ["ok"] * len(good) + ["error"]
        assert "missing.jsonl" in rows[-1]["error"]
        counting = CountingExecutor()
        run_sweep([*good, bad], tmp_path / "s.parquet", executor=counting, progress=False)
        assert counting.submitted == 1  # only the failed cell runs again

    def test_records_are_saved(self, tmp_path: Path) -> None:
        from marconi.sim.sweep import load_records

        cell = Cell.of(trace=TRACE, sessions=4, system="marconi", capacity="1GB", records=True)
        [row] = run_sweep([cell], tmp_path / "s.csv", progress=False, workers=1,
                          records_dir=tmp_path / "rec")
        rec = load_records(tmp_path / "rec", cell.cell_id)
        assert rec["hit"].sum() == row["hit_tokens"] and rec["n_input"].size == row["requests"]
        assert "_records" not in row


def test_dask_local_cluster_matches_local_processes(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from marconi.commands.sweep import sweep_executor

    cells = expand(_grid(system=["vllm+", "sglang+", "marconi", "marconi-oracle"]))
    local = run_sweep(cells, tmp_path / "local.csv", workers=2, progress=False)
    with sweep_executor("local", 2) as executor:
        remote = run_sweep(cells, tmp_path / "dask.csv", executor=executor, progress=False)
    assert [r["cell_id"] for r in remote] == [c.cell_id for c in cells]
    assert _stable(remote) == _stable(local)
    assert _stable(ResultsFile(tmp_path / "dask.csv").read()) == _stable(local)


def _progress(out: Path) -> int:
    try:
        return len(ResultsFile(out).read())
    except Exception:  # a half-written file would show up here
        return -1


def test_killed_sweep_resumes_without_redoing_cells(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    command = [sys.executable, "-m", "marconi", "sweep", TRACE, "--param", "sessions=8",
               "--systems", "sglang+,marconi,marconi-oracle", "--param", "sps=0.5,1,2,4",
               "--capacities", "200MB,400MB,800MB", "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while _progress(out) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = ResultsFile(out).read()  # must parse: never a corrupt file
    assert 3 <= len(before) < 36, "kill the sweep midway"
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert f"36 cells, {len(before)} done, {36 - len(before)} to run" in done.stderr
    after = {r["cell_id"]: r for r in ResultsFile(out).read()}
    assert len(after) == 36 and all(r["status"] == "ok" for r in after.values())
    for row in before:  # finished cells kept as they were, not recomputed
        assert after[row["cell_id"]]["wall_s"] == row["wall_s"]


def test_a_trace_loads_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import marconi.sim.sweep as sweep

    calls: list[str] = []
    real = sweep.load_trace

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "load_trace", counting)
    sweep._load.cache_clear()
    for cell in expand(_grid(seed=7, sps=[1.0, 2.0])):
        assert run_cell(cell)["status"] == "ok"
    assert len(calls) == 2  # 8 cells, 2 distinct traces (sps shapes the trace)
    sweep._load.cache_clear()


def test_a_sweep_cell_can_keep_or_sample_marconi_plus_shadows() -> None:
    """`shadow_sample_after` reaches the replay; its default leaves earlier cells' ids
    (and so their rows) as they were; bad values are named."""
    base = dict(trace="synthetic:multi-turn", sessions=30, system="marconi+", capacity="2GB")
    default, sampled = Cell.of(**base), Cell.of(**base, shadow_sample_after=100)
    exact = Cell.of(**base, shadow_sample_after=None)
    assert "shadow_sample_after" not in default.id_params()
    assert len({default.cell_id, sampled.cell_id, exact.cell_id}) == 3
    assert coerce("shadow_sample_after", "none") is None
    row = run_cell(sampled)
    assert row["status"] == "ok" and row["shadows_sampled_from"] == 100
    assert "shadows_sampled_from" not in run_cell(exact)
    with pytest.raises(ValueError, match="shadow_sample_after"):
        Cell.of(**base, shadow_sample_after=-1)
