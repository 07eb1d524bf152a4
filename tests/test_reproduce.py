from __future__ import annotations

from pathlib import Path

import pytest

from marconi.cli import main
from marconi.report.figures import FIGURES
from marconi.reproduction import load_experiments
from marconi.reproduction.config import CONFIGS, NoData, load_experiment, plan
from marconi.reproduction.reproduce import reproduce
from tests.conftest import SHARED_DATA

EXPERIMENTS = CONFIGS  # shipped inside the package
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# one tiny config per figure kind, on synthetic traces (no data files needed)
SYNTHETIC = {
    "hit-rate": 'system = ["vllm+", "sglang+", "marconi"]\ncapacity = ["300MB", "1GB"]',
    "gain": 'system = ["sglang+", "marconi"]\ncapacity = ["300MB", "1GB"]',
    "ttft": 'system = ["vanilla", "sglang+", "marconi"]\ncapacity = ["300MB", "1GB"]',
    "line": 'system = ["vllm+", "sglang+", "marconi"]\ncapacity = "500MB"\nsps = [0.5, 2.0]',
    "length-bins": 'system = ["vanilla", "sglang+", "marconi"]\ncapacity = "500MB"\n'
                   'records = true',
    "tuner": 'system = ["marconi", "marconi-oracle"]\ncapacity = "500MB"\nmultiplier = [5, 15]',
    "plus-vs-peers": 'system = ["sglang+", "marconi", "marconi+", "offline"]\n'
                     'capacity = ["300MB", "1GB"]',
}


def _write_config(folder: Path, kind: str) -> Path:
    options = '[options]\nx = "sps"\n' if kind == "line" else ""
    text = (f'title = "{kind}"\nfigure = "{kind}"\n{options}[[grid]]\n'
            f'dataset = "multi-turn"\ntrace = "synthetic:multi-turn"\nsessions = 6\n'
            f'{SYNTHETIC[kind]}\n')
    path = folder / f"{kind}.toml"
    path.write_text(text)
    return path


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 5_000


class TestFigures:
    def test_every_figure_kind_draws(self, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
        assert set(SYNTHETIC) == set(FIGURES)
        configs = [_write_config(tmp_path, kind) for kind in FIGURES]
        out = tmp_path / "out"
        outcome = reproduce([load_experiment(c) for c in configs], out, workers=2,
                            progress=False)
        assert outcome.failed_cells == 0
        # 300MB refuses every commit of these sessions: the cells' warnings are counted,
        # the first quoted (not its placeholder)
        said = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("reproduce:") and "from its cells" in line]
        assert len(said) == 1 and "the first: warning: " in said[0], said
        assert "(cell " in said[0] and "{" not in said[0]
        assert len(outcome.figures) == len(FIGURES)
        for kind in FIGURES:
            _assert_png(out / f"{kind}.png")
            table = (out / f"{kind}.md").read_text()
            assert table.count("\n|") >= 3, f"{kind}: expected a table with rows"
        assert "marconi" in (out / "SUMMARY.md").read_text()


class TestConfig:
    def test_shipped_configs_load(self) -> None:
        data = SHARED_DATA if SHARED_DATA.is_dir() else None
        experiments = load_experiments([EXPERIMENTS], data=data)
        assert {e.figure for e in experiments} == set(FIGURES)
        for name, (quick, warnings) in plan(experiments, quick=True).items():
            missing = any(isinstance(w, NoData) for w in warnings)  # no data folder
            assert quick or missing, f"{name}: no quick cells"

    def test_grids_without_the_data_folder_are_said_once_per_trace(self) -> None:
        """Without the data folder every grid over the trajectories or Mooncake is
        skipped: one line per trace naming the experiments, no `{data}` placeholder."""
        from marconi.reproduction.reproduce import _grouped

        planned = plan(load_experiments([EXPERIMENTS], data=None), quick=True)
        warnings = [w for _, ws in planned.values() for w in ws]
        assert sum(isinstance(w, NoData) for w in warnings) >= 4
        said = _grouped(warnings)
        assert len(said) == len({w.trace for w in warnings if isinstance(w, NoData)})
        assert all("{" not in line and "--data DIR" in line for line in said)
        assert any("mini-swe-agent/trajs" in line and "fig07_hit_rate" in line
                   for line in said)

    def test_across_covers_other_configurations_once(self, tmp_path: Path) -> None:
        grid = _write_config(tmp_path, "gain")  # sglang+, marconi x 2 capacities
        (tmp_path / "all.toml").write_text('figure = "plus-vs-peers"\n'
                                           'across = ["marconi", "marconi+", "nope"]\n')
        planned = plan(load_experiments([grid, tmp_path / "all.toml"]))
        mine, warnings = planned["all"]
        assert sorted((c.system, c.capacity) for c in mine) == [
            ("marconi", "1GB"), ("marconi", "300MB"), ("marconi+", "1GB"), ("marconi+", "300MB")]
        shared = {c.cell_id for c in planned["gain"][0]} & {c.cell_id for c in mine}
        assert len(shared) == 2  # marconi's cells are the gain figure's own
        assert any("nope" in w for w in warnings)

    @pytest.mark.parametrize("text", ['figure = "pie"\n[[grid]]\ntrace = "sharegpt"',
                                      'figure = "gain"\ncolour = 1\n[[grid]]\ntrace = "x"',
                                      'figure = "gain"'])
    def test_bad_configs_raise(self, tmp_path: Path, text: str) -> None:
        (tmp_path / "bad.toml").write_text(text)
        with pytest.raises(ValueError):
            load_experiment(tmp_path / "bad.toml")

    def test_missing_trace_and_unknown_system_are_skipped(self, tmp_path: Path) -> None:
        path = tmp_path / "c.toml"
        path.write_text('figure = "gain"\n[[grid]]\ntrace = "nowhere/trace.jsonl"\n'
                        'system = "marconi"\ncapacity = "1GB"\n[[grid]]\n'
                        'trace = "synthetic:multi-turn"\nsystem = ["marconi", "future-2030"]\n'
                        'capacity = "1GB"\n')
        cells, warnings = load_experiment(path).cells()
        assert [c.system for c in cells] == ["marconi"]
        assert any("not found" in w for w in warnings)
        assert any("future-2030" in w for w in warnings)


def test_quick_reproduction(tmp_path: Path) -> None:
    """The CI-sized run of every shipped config (figures whose data is absent are skipped)."""
    out = tmp_path / "results"
    data = ["--data", str(SHARED_DATA)] if SHARED_DATA.is_dir() else []
    assert main(["reproduce", "--quick", "--out", str(out), "--workers", "2", "--quiet",
                 *data]) == 0
    drawn = sorted(p.stem for p in out.glob("*.png"))
    assert "fig07_hit_rate" in drawn and "fig13b_response_time" in drawn  # ShareGPT ones
    for name in drawn:
        _assert_png(out / f"{name}.png")
    if data:
        assert len(drawn) == len(list(EXPERIMENTS.glob("*.toml")))
    summary = (out / "SUMMARY.md").read_text()
    assert "quick" in summary and "(0 failed)" in summary
