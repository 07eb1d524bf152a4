"""The engines' real cache code in our replays (marconi.engines.real): a missing environment
is one line naming the setup command, a failing engine never yields a partial result,
and each emulation agrees with the real code on a trace that evicts.

The engine environments come from `bash scripts/setup-peers.sh`; without them these tests
skip, except under CI (CI=true), where a missing environment fails: CI builds them."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import numpy as np
import pytest

from marconi.cli import main
from marconi.core.spec import PAPER_7B
from marconi.engine_flags import ENGINES
from marconi.engines.real.arrivals import NoRoom, Schedule, run_concurrent
from marconi.engines.real.envs import ENV_VAR, PeerError, available
from marconi.engines.real.worker import run_worker
from marconi.sim import SimConfig
from marconi.sim.fidelity import BOUNDS, PAIRS, agreement
from marconi.sim.run import run
from marconi.systems import get_system
from marconi.workload import TraceOptions, load_trace
from marconi.workload.types import Request

REALPEERS = Path(__file__).resolve().parents[1] / "src" / "marconi" / "engines" / "real"
TRACE = "synthetic:multi-turn:sessions=3"
# the files beside the workers that they import by name: they run in the engines'
# environments too, so they import no marconi, and may import their engine
WORKER_SIDE = {"arrivals.py", "engine_flags.py", "worker_io.py", "sglang_engine.py",
               "sglang_load.py", "sglang_options.py", "sglang_replay.py", "vllm_engine.py",
               "vllm_options.py", "vllm_replay.py", "vllm_scheduler.py"}


def need(engine: str) -> None:
    """Skip without `engine`'s environment; under CI, fail: CI builds it."""
    if available(engine):
        return
    message = f"{engine}'s environment is missing: bash scripts/setup-peers.sh {engine}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def is_vllm(engine: str) -> bool:
    """Whether `engine` runs vLLM's worker (`vllm`, `vllm-0.33`)."""
    return (ENGINES[engine].kind or ENGINES[engine].name) == "vllm"


@pytest.fixture(scope="module")
def chat():
    """40 ShareGPT sessions (514 requests): at 1-2 GB every peer evicts."""
    return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=40))


class TestWithoutTheEngine:
    def test_missing_environment_is_one_line(self, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
        monkeypatch.setenv(ENV_VAR, str(tmp_path))
        for system in ("sglang-0.5.23", "vllm-0.32:retention_interval=none"):
            assert main(["simulate", TRACE, "--system", system, "--quiet"]) == 2
            captured = capsys.readouterr()
            lines = captured.err.strip().splitlines()
            assert len(lines) == 1 and "bash scripts/setup-peers.sh" in lines[0], lines
            assert str(tmp_path) in lines[0] and captured.out == ""

    def test_no_in_process_cache(self) -> None:
        with pytest.raises(ValueError, match="sglang-2026 is its in-process emulation"):
            get_system("sglang-0.5.23").cache(PAPER_7B, "2GB")

    def test_workers_import_only_their_folder_and_nothing_else_imports_an_engine(self) -> None:
        for path in sorted((REALPEERS.parents[1]).rglob("*.py")):
            tree = ast.parse(path.read_text())
            full = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
            full |= {n.module or "" for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and not n.level}
            names = {name.split(".")[0] for name in full}
            worker_side = path.name.endswith("_worker.py") or (
                path.parent == REALPEERS and path.name in WORKER_SIDE)
            if worker_side:  # (an integration: loaded by name, asked)
                ours = {name for name in full if name.split(".")[0] == "marconi"}
                assert all(name.startswith("marconi.engines.real.")
                           or name == "marconi.engine_flags" for name in ours), (path, ours)
            elif "integrations" not in path.parts:  # an integration runs in its engine's env
                assert not names & {"sglang", "vllm"}, path


class TestConcurrentSchedule:
    """arrivals.run_concurrent, the timeline both workers run, over a toy engine whose
    `start` refuses (NoRoom) while `room` requests are running."""

    @staticmethod
    def serve(arrival: list[float], ttft: float, decode: list[int], room: int,
              cap: int = 99) -> tuple[list[tuple[str, int, float]], Schedule]:
        log: list[tuple[str, int, float]] = []
        clock = {"now": 0.0}
        held: set[int] = set()

        def start(i: int) -> tuple[int, int]:
            if len(held) >= room:
                raise NoRoom(f"request {i}: full")
            held.add(i)
            log.append(("start", i, clock["now"]))
            return 0, i

        def finish(i: int, handle: int) -> None:
            held.discard(handle)
            log.append(("finish", i, 0.0))

        schedule = run_concurrent(range(len(arrival)), arrival, decode, start, finish,
                                  lambda i, hit: ttft, 1.0, cap, lambda i: None)
        return log, schedule

    def test_finishes_due_by_an_arrival_come_first(self) -> None:
        log, schedule = self.serve([0.0, 0.5, 3.0], ttft=1.0, decode=[2, 0, 0], room=9)
        # 0 ends at 3.0 (1 + 2 x 1 s), 1 at 1.5: both before 2 starts at 3.0
        assert [(e, i) for e, i, _ in log] == [("start", 0), ("start", 1), ("finish", 1),
                                               ("finish", 0), ("start", 2), ("finish", 2)]
        assert schedule.waited == 0 and schedule.max_running == 2

    def test_a_refused_request_waits_for_the_earliest_finish(self) -> None:
        log, schedule = self.serve([0.0, 0.1, 0.2], ttft=1.0, decode=[5, 1, 0], room=2)
        # 2 finds 0 and 1 running: it waits for 1 (ends 2.1), not for 0 (ends 6.0)
        assert [(e, i) for e, i, _ in log][:4] == [("start", 0), ("start", 1),
                                                   ("finish", 1), ("start", 2)]
        assert schedule.waited == 1 and schedule.wait_seconds == pytest.approx(1.9)

    def test_the_running_cap_holds(self) -> None:
        _, schedule = self.serve([0.0] * 5, ttft=1.0, decode=[0] * 5, room=9, cap=2)
        assert schedule.max_running == 2 and schedule.waited == 3

    def test_refused_with_nothing_running_is_an_error(self) -> None:
        with pytest.raises(NoRoom, match="request 0"):
            self.serve([0.0], ttft=1.0, decode=[0], room=0)


@pytest.mark.parametrize(("emulation", "real"), PAIRS)
def test_emulation_agrees_with_the_real_code(chat, emulation: str, real: str) -> None:
    need(str(get_system(real).engine))
    found = agreement(chat, PAPER_7B, "2GB", emulation, real)
    assert found.real_hit_rate > 0.02, found  # it cached something
    assert found.within_bound, found
    if emulation not in BOUNDS:
        assert found.agrees, found


@pytest.mark.parametrize("engine", sorted(ENGINES))
class TestRealEngine:
    def test_integrity_checks_pass_on_every_request(self, chat, engine: str) -> None:
        need(engine)
        from marconi.sim.real_engine import replay

        system = get_system(ENGINES[engine].system)
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", system=system.name, bounds=False)
        summary = replay(chat, config, system, check=True).summary().to_json()
        assert summary["evictions"] > 0 and summary["token_hit_rate"] > 0
        assert summary["engine"]["version"] == ENGINES[engine].version
        assert summary["peak_bytes"] <= 1e9

    def test_concurrent_replay_holds_back_what_a_running_request_commits(
            self, engine: str) -> None:
        """B continues A's whole sequence (input and output). Arriving while A decodes, B
        can reuse at most A's input; after A finishes, A's output too."""
        need(engine)
        from marconi.sim.real_engine import replay

        prompt, output = np.arange(1, 641), np.arange(1000, 1320)
        a = Request(session_id="s", turn=0, arrival=0.0, input_tokens=prompt,
                    output_tokens=output)
        name = ENGINES[engine].system  # vLLM keeps decode states only when told to
        system = get_system(f"{name}:retention_interval=none" if is_vllm(engine) else name)
        config = SimConfig(spec=PAPER_7B, capacity="4GB", system=system.name, bounds=False,
                           concurrent=True, decode_s_per_token=0.1,  # A decodes for 32 s
                           replay="sequential")
        hits = {}
        for at in (1.0, 100.0):
            b = Request(session_id="s", turn=1, arrival=at,
                        input_tokens=np.concatenate([prompt, output, np.arange(2000, 2200)]),
                        output_tokens=np.arange(3000, 3010))
            result = replay([a, b], config, system, check=True)
            hits[at] = int(result.records.hit[1])
            assert result.engine is not None and result.engine["max_running"] == (
                2 if at == 1.0 else 1)
        assert hits[1.0] <= len(prompt) < hits[100.0], hits

    def test_a_request_too_big_names_itself(self, engine: str) -> None:
        need(engine)
        long = load_trace("synthetic:multi-turn:sessions=2,turns=3,user_len=6000")
        with pytest.raises(PeerError) as err:
            run(long, SimConfig(replay="sequential", spec=PAPER_7B, capacity="400MB",
                                system=ENGINES[engine].system, bounds=False))
        assert re.search(r"request \d+: needs \d+", str(err.value)), str(err.value)

    def test_a_bad_option_fails_with_the_workers_words(self, engine: str) -> None:
        need(engine)
        with pytest.raises(PeerError) as err:
            run_worker(ENGINES[engine], load_trace(TRACE), {"colour": "red"})
        assert "colour" in str(err.value) and "exit 2" in str(err.value)

    def test_a_sweep_cell_runs_it(self, engine: str) -> None:
        need(engine)
        from marconi.sim.sweep import Cell, run_cell

        system = f"{ENGINES[engine].system}:max_num_batched_tokens=4096" if is_vllm(engine) \
            else f"{ENGINES[engine].system}:chunked_prefill_size=4096"
        row = run_cell(Cell.of(trace=TRACE, sessions=3, system=system, capacity="1GB",
                               replay="sequential"))  # the engine's code runs its own
        assert row["status"] == "ok", row["error"]
        assert row["system"] == system and row["token_hit_rate"] > 0

    def test_compare_runs_it_like_any_system(self, engine: str,
                                             capsys: pytest.CaptureFixture) -> None:
        need(engine)
        system = ENGINES[engine].system
        assert main(["compare", TRACE, "--systems", f"sglang+,{system}", "--quiet",
                     "--replay", "sequential"]) == 0
        out = capsys.readouterr().out
        assert system in out
