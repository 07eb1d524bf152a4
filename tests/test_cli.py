"""The CLI's conventions: help with defaults, --version, extras checked before any work,
records written as real CSV, and errors instead of tracebacks."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from marconi import __version__
from marconi.cli import main, parser
from marconi.core.spec import PAPER_7B
from marconi.sim import SimConfig, simulate
from marconi.sim.oracle import oracle
from marconi.sim.result import ORACLE
from marconi.sim.sweep import InlineExecutor
from marconi.workload import TraceOptions, load_trace

TRACE = "synthetic:multi-turn:sessions=3"


class TestHelp:
    def test_version(self, capsys: pytest.CaptureFixture) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["--version"])
        assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"marconi {__version__}"

    @pytest.mark.parametrize(("command", "shown"), [
        ("simulate", ["--capacity CAPACITY", "(default: 2GB)", "(default: 32768)",
                      "(default: 100)", "(default: mistral-v1)", "(default: marconi)",
                      "pseudo-random tokens) (default: 0)", "types (default: 0.0)"]),
        ("serve", ["port to listen on (default: 8000)", "runs (default: marconi)"]),
        ("sweep", ["(default: vllm+,sglang+,marconi)", "(default: 32768)"]),
        ("reproduce", ["(default: out/reproduce)"]),
    ])
    def test_help_shows_defaults(self, command: str, shown: list[str]) -> None:
        sub = parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = " ".join(sub.format_help().split())
        for piece in shown:
            assert " ".join(piece.split()) in text, piece


class TestValueErrors:
    """A mistyped value is one line on stderr naming the flag, the value and the nearest
    valid choice; no usage dump, no traceback, exit status 2."""

    @pytest.mark.parametrize(("argv", "said"), [
        (["simulate", TRACE, "--system", "marconni"],
         "argument --system: unknown system 'marconni' (did you mean marconi?)"),
        (["compare", TRACE, "--systems", "vlm+"], "unknown system 'vlm+' (did you mean vllm+?)"),
        (["simulate", TRACE, "--format", "sharegtp"],
         "argument --format: invalid choice 'sharegtp' (did you mean sharegpt?)"),
        (["simulate", TRACE, "--sessions", "-1"], "argument --sessions: '-1' is not"),
        (["simulate", TRACE, "--capacity", "-5GB"],
         "argument --capacity: size must be >= 0 bytes, got '-5GB'"),
        (["simulate", TRACE, "--capacity", "2", "GB"],
         "argument --capacity: '2' and 'GB' are two words; write the size without a space: "
         "--capacity 2GB"),
        (["simulate", TRACE, "--capcity", "2GB"],
         "unrecognized argument --capcity (did you mean --capacity?)"),
        (["simulate", TRACE, "--system", "sglang-0.5.23:integraton=marconi"],
         "unknown option 'integraton' (did you mean integration?)"),
        (["simulate", TRACE, "--system", "marconi-orcle"],  # the references are systems too
         "(did you mean marconi-oracle?); known systems: vanilla, "),
        (["compare", TRACE, "--systems", "vanilla,ofline"],
         "marconi-oracle, offline, reuse-oracle (or load your own with --plugin)"),
        (["simulate", "synthetic:multiturn"],
         "unknown trace format 'synthetic:multiturn' (did you mean synthetic:multi-turn?); "
         "known: artifact, sharegpt, "),
        (["compare", TRACE, "--quiet", "--plot", "out/x.pdff"],  # before any replay
         "--plot: out/x.pdff: matplotlib writes no '.pdff' files; end it in "),
    ])
    def test_one_line_with_the_nearest_choice(self, capsys: pytest.CaptureFixture,
                                              argv: list[str], said: str) -> None:
        with pytest.raises(SystemExit) as exit_:
            code = main(argv)
            raise SystemExit(code)
        captured = capsys.readouterr()
        err = captured.err
        assert exit_.value.code == 2 and said in err, err
        assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
        assert captured.out == ""  # nothing replayed

    def test_a_bare_command_lists_the_subcommands(self, capsys: pytest.CaptureFixture) -> None:
        assert main([]) == 0
        out = capsys.readouterr().out
        commands = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        for name in commands:
            assert any(line.split()[:1] == [name] and len(line.split()) > 1
                       for line in out.splitlines()), name

    def test_a_flag_says_what_it_does_not_its_default(self) -> None:
        sub = parser()._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr]
        text = " ".join(sub.format_help().split())
        assert "--no-bounds" in text and "(default: True)" not in text
        assert "(default: False)" not in text

    @pytest.mark.parametrize("command", ["simulate", "compare", "sweep"])
    def test_a_no_flag_says_what_it_turns_off(self, command: str) -> None:
        """`--no-bounds` skips the infinite caches: its help says so, not what they do."""
        sub = parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        helps = {a.option_strings[0]: " ".join((a.help or "").split())
                 for a in sub._actions if a.option_strings}
        assert helps["--no-bounds"].startswith("skip the infinite caches' replay"), helps
        assert "also replay" not in helps["--no-bounds"]
        for flag, text in helps.items():
            if flag.startswith("--no-"):
                assert f"({flag}" not in text, (flag, text)  # never names itself as the other

    def test_alpha_beyond_the_tuners_grid_is_said_loudly(self, capsys: pytest.CaptureFixture
                                                         ) -> None:
        sub = parser()._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr]
        assert "the tuner picks from 0 to 2" in " ".join(sub.format_help().split())
        assert main(["simulate", "synthetic:multi-turn:sessions=1", "--quiet", "--alpha", "5",
                     "--no-bounds", "--json"]) == 0
        err = capsys.readouterr().err
        assert err.startswith("marconi: warning: --alpha 5 is beyond the tuner's grid (0 to 2)")
        assert main(["simulate", "synthetic:multi-turn:sessions=1", "--quiet", "--alpha", "2",
                     "--no-bounds", "--json"]) == 0
        assert "warning" not in capsys.readouterr().err


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make these modules impossible to import, as if their extra were not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


class TestExtrasFirst:
    """A missing extra is named before any replay runs (stdout stays empty)."""

    def _fails(self, capsys: pytest.CaptureFixture, argv: list[str], extra: str) -> None:
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert f"'{extra}' extra" in captured.err and f"marconi[{extra}]" in captured.err
        assert captured.out == "" and "Traceback" not in captured.err

    def test_plot(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                  tmp_path: Path) -> None:
        _block(monkeypatch, "matplotlib")
        self._fails(capsys, ["compare", TRACE, "--quiet", "--plot", str(tmp_path / "p.png")],
                    "plot")

    def test_records_parquet(self, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
        _block(monkeypatch, "pyarrow")
        self._fails(capsys, ["simulate", TRACE, "--quiet", "--records",
                             str(tmp_path / "r.parquet")], "traces")

    def test_parquet_input(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                           tmp_path: Path) -> None:
        path = tmp_path / "lmsys.parquet"
        path.write_bytes(b"PAR1" + b"\0" * 16)
        _block(monkeypatch, "pyarrow")
        self._fails(capsys, ["simulate", str(path), "--quiet"], "traces")

    def test_scheduler(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                       tmp_path: Path) -> None:
        _block(monkeypatch, "dask", "distributed")
        self._fails(capsys, ["sweep", TRACE, "--scheduler", "local", "--quiet", "--out",
                             str(tmp_path / "s.csv")], "distributed")
        assert not (tmp_path / "s.csv").exists()

    def test_reproduce(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                       tmp_path: Path) -> None:
        _block(monkeypatch, "matplotlib")
        self._fails(capsys, ["reproduce", "--quick", "--quiet", "--out", str(tmp_path)],
                    "plot")
        assert not (tmp_path / "sweep.csv").exists()  # refused before the sweep


class TestErrors:
    def test_a_named_trace_with_a_file_format(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["simulate", "sharegpt", "--format", "mooncake", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "'sharegpt' names a built-in trace" in err and "Traceback" not in err


class TestRecords:
    def test_csv_keeps_session_ids_with_commas_and_quotes(self, tmp_path: Path) -> None:
        rows = [{"session_id": 'user,1 "vip"', "turn_id": t, "ts": float(t),
                 "input_tokens": list(range(10 + 5 * t)), "output_tokens": [7, 8]}
                for t in range(3)]
        trace = tmp_path / "t.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / "r.csv"
        assert main(["simulate", str(trace), "--quiet", "--records", str(out),
                     "--capacity", "1GB"]) == 0
        with out.open(newline="") as f:
            read = list(csv.DictReader(f))
        assert [r["session"] for r in read] == ['user,1 "vip"'] * 3
        assert [int(r["n_input"]) for r in read] == [10, 15, 20]
        assert float(read[1]["arrival"]) == 1.0


def test_oracle_reports_the_time_of_all_its_replays() -> None:
    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12))
    config = SimConfig(spec=PAPER_7B, capacity="300MB", system=ORACLE, bounds=False)
    best = oracle(trace, config, executor=InlineExecutor())
    one = simulate(trace, SimConfig(spec=PAPER_7B, capacity="300MB", system="marconi",
                                    alpha=best.alpha, bounds=False))
    assert best.tuning is not None and len(best.tuning.to_json()["scores"]) == 21  # type: ignore[arg-type]
    # the wall time covers the 21 replays (run one after another here), not the best one
    assert best.seconds >= best.tuning.replay_seconds > 0  # type: ignore[attr-defined]
    assert np.array_equal(best.records.hit, one.records.hit)


class TestShadowSampling:
    """`--shadow-sample-after`: marconi+'s shadows sampled on long replays, said on stderr."""

    ARGS = ("simulate", "synthetic:multi-turn", "--sessions", "30", "--system", "marconi+",
            "--capacity", "2GB", "--no-bounds", "--json", "--quiet", "--replay", "sequential")

    def test_sampled_after_n_requests_and_said(self, capsys: pytest.CaptureFixture) -> None:
        assert main([*self.ARGS, "--shadow-sample-after", "100"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["tuning"]["sampled_from"] == 100
        assert "from request 100 on, its shadow experts saw 12.5% of the sessions" in err

    def test_none_keeps_them_exact(self, capsys: pytest.CaptureFixture) -> None:
        assert main([*self.ARGS, "--shadow-sample-after", "none"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["tuning"]["sampled_from"] is None and "shadow" not in err

    def test_a_bad_value_is_named(self, capsys: pytest.CaptureFixture) -> None:
        with pytest.raises(SystemExit):
            main([*self.ARGS, "--shadow-sample-after", "soon"])
        assert "--shadow-sample-after" in capsys.readouterr().err
