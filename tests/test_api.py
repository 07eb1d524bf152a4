"""The notebook API (`marconi.api`) and user policies loaded with `--plugin`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import marconi.api as mc
from marconi.cli import main
from marconi.systems import SYSTEMS

TRACE = "synthetic:multi-turn"
PLUGIN = '''
from marconi.systems import system


@system("my-lru", "a user policy: judicious admission, LRU over leaves (sglang+'s pair)")
def _my_lru(spec, alpha):
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import LRULeaf

    return Judicious(), LRULeaf()
'''


class TestApi:
    def test_simulate_matches_the_cli(self, capsys: pytest.CaptureFixture) -> None:
        result = mc.simulate(TRACE, system="sglang+", capacity="300MB", sessions=6)
        assert main(["simulate", TRACE, "--sessions", "6", "--system", "sglang+",
                     "--capacity", "300MB", "--json", "--quiet"]) == 0
        cli = json.loads(capsys.readouterr().out)
        ours = result.summary
        assert {k: v for k, v in ours.items() if k != "seconds"} == \
            {k: v for k, v in cli.items() if k != "seconds"}

    def test_records_as_a_dataframe(self) -> None:
        pd = pytest.importorskip("pandas")
        result = mc.simulate(TRACE, system="marconi", capacity="1GB", sessions=4)
        frame = result.to_pandas()
        assert isinstance(frame, pd.DataFrame)
        assert len(frame) == result.summary["requests"]
        assert frame["hit"].sum() == result.summary["hit_tokens"]
        assert {"session", "arrival", "n_input", "ttft_s"} <= set(frame.columns)

    def test_compare_is_one_row_per_system(self) -> None:
        pytest.importorskip("pandas")
        frame = mc.compare(TRACE, ["vanilla", "sglang+"], capacity="1GB", sessions=4)
        assert list(frame["system"]) == ["vanilla", "sglang+"]
        assert frame["hit_tokens"].iloc[0] == 0 < frame["hit_tokens"].iloc[1]
        shown = repr(frame).splitlines()  # what a reader compares, not "[2 rows x 34 ...]"
        assert shown[0].split()[:3] == ["system", "token_hit_rate", "flops_saved_rate"]
        assert shown[2].split()[0] == "sglang+" and "more columns in .columns" in shown[-1]
        assert "x" not in shown[-1].split()

    def test_a_system_without_alpha_has_none_in_the_frame(self) -> None:
        """As the CLI's table shows "-", never 0.0 as if tuned to zero."""
        pd = pytest.importorskip("pandas")
        frame = mc.compare(TRACE, ["sglang+", "marconi"], capacity="1GB", sessions=4,
                           alpha=0.5)
        assert pd.isna(frame["alpha"].iloc[0]) and frame["alpha"].iloc[1] == 0.5

    def test_bad_input_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="is 0 bytes"):
            mc.simulate(TRACE, capacity=0)
        with pytest.raises(ValueError, match="unknown system"):
            mc.simulate(TRACE, system="nope")


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Path]:
    """A user's policy module on disk; unregistered afterwards."""
    path = tmp_path / "my_policies.py"
    path.write_text(PLUGIN)
    yield path
    SYSTEMS.pop("my-lru", None)
    for name in [n for n in sys.modules if n.endswith("my_policies")]:
        del sys.modules[name]


class TestPlugin:
    def test_compare_by_name(self, plugin: Path, capsys: pytest.CaptureFixture) -> None:
        argv = ["compare", TRACE, "--sessions", "6", "--capacity", "300MB", "--quiet",
                "--json", "--systems", "sglang+,my-lru"]
        assert main(argv) == 2  # unknown without the plugin
        assert "my-lru" in capsys.readouterr().err
        assert main([*argv, "--plugin", str(plugin)]) == 0
        sglang, mine = json.loads(capsys.readouterr().out)
        assert mine["system"] == "my-lru" and mine["hit_tokens"] == sglang["hit_tokens"]

    def test_simulate_choice_and_module_name(self, plugin: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(plugin.parent)
        assert main(["simulate", TRACE, "--sessions", "3", "--system", "my-lru", "--plugin",
                     "my_policies", "--json", "--quiet"]) == 0
        assert json.loads(capsys.readouterr().out)["system"] == "my-lru"

    def test_sweep_workers_load_it(self, plugin: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
        out = tmp_path / "s.csv"
        assert main(["sweep", TRACE, "--sessions", "4", "--systems", "my-lru,sglang+",
                     "--capacities", "300MB", "--out", str(out), "--workers", "2",
                     "--quiet", "--plugin", str(plugin)]) == 0
        assert "my-lru" in capsys.readouterr().out

    def test_missing_plugin(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["simulate", TRACE, "--plugin", "no_such_module_here"]) == 2
        assert "no module named 'no_such_module_here'" in capsys.readouterr().err


def test_the_package_exports_the_api_lazily() -> None:
    import subprocess
    import sys

    code = ("import sys, marconi; before = 'marconi.api' in sys.modules; "
            "print(before, marconi.simulate is __import__('marconi.api').api.simulate, "
            "marconi.compare.__module__, marconi.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:3] == ["False", "True", "marconi.api"]
    assert out[3] == __import__("importlib.metadata").metadata.version("marconi")
