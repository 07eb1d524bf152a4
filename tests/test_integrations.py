"""Marconi inside SGLang's own cache code (marconi.integrations.sglang): it refuses what it
cannot run with one line, SGLang's integrity checks pass after every request with it in,
it saves at least the stock engine's FLOPs, and its tuner runs off the scheduling loop.

The engine tests need SGLang's environment (`bash scripts/setup-peers.sh sglang`): they
skip without it, except under CI (CI=true), where they fail."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from marconi.core.spec import PAPER_7B
from marconi.integrations import sglang as integration
from marconi.realpeers.envs import PeerError, envs_dir
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.systems import get_system
from tests.test_realpeers import need

ROOT = Path(__file__).resolve().parents[1]
STOCK, WITH = "sglang-0.5.23", "sglang-0.5.23:integration=marconi"


class TestWithoutTheEngine:
    def test_the_plugin_does_nothing_unless_asked(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(integration.ENABLE, raising=False)
        assert integration.plugin() is None and integration._installed is None

    @pytest.mark.parametrize(("env", "said"), [
        ({"MARCONI_SGLANG": "marconi"}, "needs MARCONI_MODEL"),
        ({"MARCONI_SGLANG": "lfu", "MARCONI_MODEL": "paper-7b"}, "unknown policy 'lfu'"),
        ({"MARCONI_SGLANG": "marconi", "MARCONI_MODEL": "no-such-model"}, "no-such-model"),
        ({"MARCONI_SGLANG": "marconi", "MARCONI_MODEL": "paper-7b"}, "sglang is not installed"),
    ])
    def test_a_bad_setting_stops_the_process_with_one_line(
            self, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str) -> None:
        for key in ("MARCONI_SGLANG", "MARCONI_MODEL", "MARCONI_ALPHA"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(SystemExit) as stop:  # SGLang would log an exception, run stock
            integration.plugin()
        message = str(stop.value.code)
        assert message.startswith("error: ") and said in message and "\n" not in message

    def test_the_entry_point_names_the_plugin(self) -> None:
        meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
        entry = meta["project"]["entry-points"]["sglang.srt.plugins"]["marconi"]
        assert entry == "marconi.integrations.sglang:plugin"

    def test_the_rust_core_is_refused_before_any_work(self) -> None:
        with pytest.raises(PeerError, match="Python tree core"):
            run(_small(), SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False,
                                    system=f"{WITH},core=rust"))


def _small():
    from marconi.workload import load_trace

    return load_trace("synthetic:multi-turn:sessions=3")


def _engine_python() -> Path:
    return envs_dir() / "sglang" / "bin" / "python"


class TestInsideSGLang:
    def test_any_other_version_is_refused(self) -> None:
        need("sglang")
        code = ("import importlib.metadata as m; m.version = lambda name: '0.5.22'\n"
                "from marconi.integrations.sglang import install\n"
                "from marconi.core.spec import PAPER_7B\n"
                "install(PAPER_7B)\n")
        done = subprocess.run([str(_engine_python()), "-c", code], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert done.returncode != 0
        assert "supports sglang 0.5.23 only; this environment has 0.5.22" in done.stderr

    def test_checks_pass_and_its_order_saves_more_than_stock(self, chat, stock) -> None:
        """alpha fixed at 2 (what the tuner picks here): deterministic, and its order, not
        the tuner's timing, is what is measured (evicting highest scores first loses)."""
        need("sglang")
        from marconi.realpeers.replay import replay

        config = SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH,
                           alpha=2.0)
        ours = replay(chat, config, get_system(WITH), check=True).summary()
        hook = ours["engine"]["integration"]
        assert hook["policy"] == "marconi" and hook["victims"] > 0  # its walk evicted
        assert ours["alpha"] == 2.0 and ours["alpha_status"] == "fixed"
        assert ours["flops_saved"] > 1.1 * stock.summary()["flops_saved"], (
            ours["flops_saved_rate"], stock.summary()["flops_saved_rate"])

    def test_the_tuner_tunes_off_the_scheduling_loop(self, chat) -> None:
        need("sglang")
        ours = run(chat, SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH),
                   warn=False).summary()
        hook = ours["engine"]["integration"]
        assert ours["alpha_status"] == "tuned" and ours["alpha"] == hook["alpha"] > 0
        assert hook["tuner_off_loop"] is True  # the mirror and replays: its own thread
        assert hook["requests"] == len(chat) and hook["tuner_ns"] > 0

    @pytest.mark.parametrize(("trace", "seed", "capacity"), [
        ("synthetic:agent:sessions=8", 11, "3GB"),
        ("synthetic:multi-turn:sessions=30", 12, "1GB"),
        ("synthetic:multi-turn:sessions=40,turns=6", 15, "800MB"),
    ])
    def test_integrity_holds_on_fuzzed_traces_that_evict(self, trace: str, seed: int,
                                                         capacity: str) -> None:
        """SGLang's `sanity_check()` and pool accounting after every request, with
        Marconi's walk choosing the victims (alpha 2) on traces of other shapes."""
        need("sglang")
        from marconi.realpeers.replay import replay
        from marconi.workload import TraceOptions, load_trace

        config = SimConfig(spec=PAPER_7B, capacity=capacity, bounds=False, system=WITH,
                           alpha=2.0)
        requests = load_trace(trace, options=TraceOptions(seed=seed))
        ours = replay(requests, config, get_system(WITH), check=True).summary()
        assert ours["engine"]["integration"]["victims"] > 0 and ours["evictions"] > 0

    def test_a_fixed_alpha_of_zero_is_the_stock_engine(self, chat, stock) -> None:
        """At alpha 0 Marconi's order is SGLang's LRU: every hit is the stock engine's."""
        need("sglang")
        ours = run(chat, SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH,
                                   alpha=0.0), warn=False)
        assert (ours.records.hit == stock.records.hit).all()
        assert ours.alpha_status == "fixed" and ours.stats.evictions > 0


@pytest.fixture(scope="module")
def chat():
    from marconi.workload import TraceOptions, load_trace

    return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=40))


@pytest.fixture(scope="module")
def stock(chat):
    """The stock engine on `chat` at 1 GB, its integrity checks after every request."""
    need("sglang")
    from marconi.realpeers.replay import replay

    config = SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False, system=STOCK)
    return replay(chat, config, get_system(STOCK), check=True)
