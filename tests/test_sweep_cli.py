"""`marconi sweep` as an operator runs it: trace flags, a trace column, stable cell ids,
progress in log files, the Dask dashboard, and Ctrl-C / SIGTERM / SIGKILL that leave no
worker behind. Every process started here is killed by the end of its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from marconi.cli import main
from marconi.sim.results_file import ResultsFile
from marconi.sim.sweep import Cell
from tests.helpers import make_summary

TRACE = "synthetic:multi-turn"
# a sweep long enough to interrupt: 36 cells of the oracle (21 replays each)
LONG = [sys.executable, "-m", "marconi", "sweep", TRACE, "--param", "sessions=10",
        "--systems", "marconi-oracle,marconi", "--param", "sps=0.5,1,2,4,8,16",
        "--capacities", "200MB,400MB,800MB", "--workers", "2"]


class TestFlags:
    def test_trace_column_tells_two_traces_apart(self, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
        assert main(["sweep", TRACE, "synthetic:agent", "--sessions", "3", "--systems",
                     "sglang+", "--capacities", "1GB", "--out", str(tmp_path / "s.csv"),
                     "--workers", "1", "--quiet"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[0] == "trace"
        assert sorted(line.split()[0] for line in lines[2:]) == ["synthetic:agent",
                                                                 "synthetic:multi-turn"]

    def test_rows_differing_by_any_axis_or_folder_are_told_apart(
            self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        from tests.test_sim import _artifact

        traces = []
        for folder in ("d1", "d2"):
            (tmp_path / folder).mkdir()
            traces.append(str(_artifact(tmp_path / folder)))
        assert Path(traces[0]).name == Path(traces[1]).name
        assert main(["sweep", *traces, "--systems", "sglang+", "--capacities", "1GB",
                     "--param", "multiplier=3,5", "--out", str(tmp_path / "s.csv"),
                     "--workers", "1", "--quiet"]) == 0
        lines = capsys.readouterr().out.splitlines()
        # no row has a dataset here: no empty dataset column
        assert lines[0].split()[:5] == ["trace", "capacity", "model", "multiplier", "system"]
        name = Path(traces[0]).name
        words = [line.split() for line in lines[2:]]
        rows = sorted((w[0], w[w.index("sglang+") - 1]) for w in words)
        assert rows == [(f"d1/{name}", "3"), (f"d1/{name}", "5"),
                        (f"d2/{name}", "3"), (f"d2/{name}", "5")]

    def test_a_setting_the_trace_does_not_use_is_refused(
            self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        """`min_turns` over a synthetic trace, `sps` over the artifact's timestamped
        requests: identical rows, refused before any cell runs, naming where each applies."""
        from tests.test_sim import _artifact

        out = tmp_path / "s.csv"
        assert main(["sweep", TRACE, "--systems", "sglang+", "--capacities", "1GB",
                     "--param", "min_turns=1,4", "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "--min-turns 1 does not apply to synthetic:multi-turn traces" in err
        assert "sharegpt" in err and not out.exists()
        assert main(["simulate", str(_artifact(tmp_path)), "--sps", "2", "--quiet"]) == 2
        assert "--sps 2.0 does not apply to artifact traces" in capsys.readouterr().err
        assert main(["compare", TRACE, "--mean-gap", "2", "--sessions", "3", "--capacity",
                     "1GB", "--systems", "sglang+", "--quiet", "--no-bounds"]) == 0

    def test_config_with_grid_flags_is_refused(self, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
        config = tmp_path / "g.toml"
        config.write_text('[[grid]]\ntrace = ["synthetic:agent"]\nsystem = ["sglang+"]\n'
                          'capacity = "1GB"\nsessions = 2\n')
        out = str(tmp_path / "s.csv")
        assert main(["sweep", "--config", str(config), "--sessions", "3", "--systems",
                     "marconi", "--out", out, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "--systems, --sessions would be ignored" in err and "Traceback" not in err
        config.write_text('[[grid]]\ntrace = ["synthetic:agent"]\n')
        assert main(["sweep", "--config", str(config), "--out", out, "--quiet"]) == 2
        assert "lacks required parameter(s) ['system', 'capacity']" in capsys.readouterr().err

    def test_any_trace_knob_is_a_param_and_a_flag(self, tmp_path: Path) -> None:
        out = tmp_path / "s.csv"
        assert main(["sweep", "sharegpt", "--sessions", "3", "--systems", "sglang+",
                     "--capacities", "1GB", "--param", "min_turns=1,2",
                     "--max-input-tokens", "5000", "--out", str(out), "--workers", "1",
                     "--quiet"]) == 0
        rows = ResultsFile(out).read()
        assert sorted(r["min_turns"] for r in rows) == [1, 2]
        assert {r["max_input_tokens"] for r in rows} == {5000}

    def test_a_refusing_cell_is_warned_on_stderr(self, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
        # vLLM+ keeps a state every 32 tokens: at 2 GB no agent call fits
        assert main(["sweep", "synthetic:agent", "--sessions", "2", "--systems",
                     "vllm+,sglang+", "--capacities", "2GB", "--out", str(tmp_path / "s.csv"),
                     "--workers", "1", "--quiet"]) == 0
        warnings = [line for line in capsys.readouterr().err.splitlines()
                    if line.startswith("warning:")]
        assert len(warnings) == 1, warnings
        assert "vllm+ refused 40 of 40 commits" in warnings[0]
        assert "synthetic:agent" in warnings[0]

    def test_recorded_cell_ids_are_kept(self) -> None:
        """Ids that results files were written with: a setting at its default leaves them
        unchanged, one set off its default changes them."""
        # every row recorded before the serving replay and the re-tuning tuner
        old: dict[str, Any] = {"replay": "sequential", "retune": False}
        assert Cell.of(trace=TRACE, system="marconi", capacity="1GB",
                       **old).cell_id == "b6ad38e8ded765ad"
        assert Cell.of(trace="/work/shared/data/mini-swe-agent/trajs", dataset="swe-agent",
                       system="marconi+", capacity="20GB", sessions=99,
                       sps=0.5, **old).cell_id == "39cc04e81063417e"
        for changed in ({"min_turns": 2}, {"page_size": 16}, {"bounds": False},
                        {"concurrent": True}, {"replay": "serving"}, {"retune": True}):
            assert Cell.of(trace=TRACE, system="marconi", capacity="1GB",
                           **{**old, **changed}).cell_id != "b6ad38e8ded765ad"
        # the serving replay, the default now, is never read back as a sequential row
        assert Cell.of(trace=TRACE, system="marconi", capacity="1GB").cell_id != \
            "b6ad38e8ded765ad"

    def test_progress_in_a_log_file_is_lines_not_frames(self, tmp_path: Path) -> None:
        log = tmp_path / "sweep.log"
        with log.open("w") as stderr:
            subprocess.run([sys.executable, "-m", "marconi", "sweep", TRACE, "--sessions", "3",
                            "--systems", "sglang+,vllm+", "--capacities", "1GB", "--out",
                            str(tmp_path / "s.csv"), "--workers", "1"],
                           stdout=subprocess.DEVNULL, stderr=stderr, timeout=120, check=True)
        text = log.read_text()
        assert "\r" not in text
        assert "sweep: 2/2 done" in text


def test_dask_dashboard_address_is_printed(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("distributed")
    from marconi.commands.sweep import sweep_executor

    with sweep_executor("local", 1):
        pass
    err = capsys.readouterr().err
    # the dashboard needs bokeh: with it the address, without it the line saying so
    import importlib.util

    expected = ("Dask dashboard at http://127.0.0.1:" if importlib.util.find_spec("bokeh")
                else "no Dask dashboard")
    assert expected in err, err


def _interruptible() -> None:
    """Ctrl-C as at a terminal: a background job of a non-interactive shell (a CI script's
    `cmd &`) starts with SIGINT ignored, and children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("w") as stderr:
        return subprocess.Popen([*LONG, "--out", str(out), *extra], stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True,
                                preexec_fn=_interruptible)


def _wait_for_workers(proc: subprocess.Popen[bytes], out: Path) -> list[psutil.Process]:
    """The sweep's descendants once it has finished a first cell (bounded wait)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and ResultsFile(out).read():
            break
        time.sleep(0.1)
    return psutil.Process(proc.pid).children(recursive=True)


def _gone(processes: list[psutil.Process], within: float = 15.0) -> list[psutil.Process]:
    """Processes still alive after `within` seconds; kills them so none outlives the test."""
    _, alive = psutil.wait_procs(processes, timeout=within)
    for process in alive:
        process.kill()
    return alive


def _signal_midway(tmp_path: Path, how: signal.Signals,
                   *extra: str) -> tuple[list[psutil.Process], int, str, Path]:
    """Start the long sweep, send `how` once it has finished a cell (SIGINT to the whole
    group, as Ctrl-C does), wait for it: its workers then, exit status, stderr, results."""
    out, log = tmp_path / "s.csv", tmp_path / "err.log"
    proc = _start(out, log, *extra)
    try:
        workers = _wait_for_workers(proc, out)
        if how is signal.SIGINT:
            os.killpg(proc.pid, how)  # Ctrl-C: the whole foreground group gets it
        else:
            os.kill(proc.pid, how)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return workers, code, log.read_text(), out


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupt_or_kill_leaves_no_worker(tmp_path: Path, how: signal.Signals) -> None:
    workers, code, text, out = _signal_midway(tmp_path, how)
    assert workers, "the sweep should have worker processes"
    assert _gone(workers) == [], "workers outlived the sweep"
    assert "Traceback" not in text
    if how is not signal.SIGKILL:
        assert code == 128 + how and "interrupted; finished cells are kept" in text
        assert len(text.splitlines()) < 10
    assert ResultsFile(out).read()  # what finished is kept


def test_ctrl_c_on_a_local_dask_cluster_says_one_line(tmp_path: Path) -> None:
    """Dask's workers log every task a Ctrl-C cancels; the user sees the sweep's line."""
    workers, code, text, _ = _signal_midway(tmp_path, signal.SIGINT, "--scheduler", "local")
    assert _gone(workers) == [], "workers outlived the sweep"
    assert code == 130 and "interrupted; finished cells are kept" in text
    assert "WARNING" not in text and "Traceback" not in text, text


ORPHAN = """
import sys, time
from marconi.paper.tuner import _local_executor
pool = _local_executor(2, wait=True)
for _ in range(2):
    pool.submit(time.sleep, 120)
time.sleep(1)
print(*(p.pid for p in pool._processes.values()), flush=True)
time.sleep(120)
"""


def test_a_killed_worker_takes_its_tuner_replays_with_it() -> None:
    # a sweep's `stop` SIGKILLs a worker that may be running the bootstrap tuner's replay
    # processes; they must not run on for minutes
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        replays = [psutil.Process(int(pid)) for pid in proc.stdout.readline().split()]
        assert len(replays) == 2
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _gone(replays, within=10) == [], "the tuner's replays outlived their worker"


def test_the_table_shows_a_dataset_column_only_where_a_row_has_one() -> None:
    from marconi.commands.sweep import sweep_table

    figures = make_summary(system="marconi", alpha=1.0, alpha_status="tuned").to_row()
    base = {"trace": "t.jsonl", "capacity": "1GB", "model": "paper-7b", "system": "marconi",
            "alpha_fixed": None} | figures
    header = sweep_table([base | {"dataset": None}, base | {"dataset": ""}]).split("\n")[0]
    assert "dataset" not in header.split() and header.split().count("alpha") == 1
    varied = [base | {"dataset": "sharegpt", "alpha_fixed": 0.5}, base | {"dataset": None}]
    header = sweep_table(varied).split("\n")[0].split()
    assert header[:2] == ["trace", "dataset"] and header.count("alpha") == 1
    assert "alpha_fixed" in header  # the axis that varies, beside the alpha in force
