from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi.cli import main
from marconi.core.cache import PrefixCache
from marconi.core.layout import Layout
from marconi.core.spec import PAPER_7B
from marconi.sim import FlopsLatency, ProfileLatency, SimConfig, simulate
from marconi.sim.bounds import UNBOUNDED, KeepAll, keep_all
from marconi.sim.result import ORACLE, REFERENCES
from marconi.sim.run import run
from marconi.systems import System, get_system
from marconi.workload import Trace, TraceOptions, load_trace
from tests.helpers import CACHES, make_summary

CONTRACT = ("system", "requests", "input_tokens", "hit_tokens", "token_hit_rate",
            "request_hit_rate", "flops_saved", "flops_total", "alpha", "states_admitted",
            "evictions", "peak_bytes", "seconds")


def _trace(name: str = "synthetic:multi-turn") -> Trace:
    return load_trace(name, options=TraceOptions(sessions=12, seed=3))


def _artifact(tmp_path: Path) -> Path:
    """A small trace in the paper artifact's JSONL format: 3 sessions of 4 turns."""
    rng = np.random.default_rng(0)
    lines = []
    for s in range(3):
        history = list(range(1000, 1200))  # a shared system prompt
        for t in range(4):
            inp = history + rng.integers(0, 30_000, 150).tolist()
            out = rng.integers(0, 30_000, 40).tolist()
            lines.append({"session_id": s, "turn_id": t, "ts": s * 1.0 + t * 10.0,
                          "input_tokens": inp, "output_tokens": out})
            history = inp + out
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    return path


class TestSimulate:
    @pytest.mark.parametrize("system", sorted(CACHES))
    def test_summary_is_consistent(self, system: str) -> None:
        result = simulate(_trace(), SimConfig(spec=PAPER_7B, capacity="3GB", system=system))
        s = result.summary()
        assert all(key in s.to_json() for key in CONTRACT)
        assert 0 <= s.hit_tokens <= s.input_tokens
        assert s.token_hit_rate == pytest.approx(s.hit_tokens / s.input_tokens)
        assert 0 <= s.flops_saved <= s.flops_total
        assert s.peak_bytes <= 3e9
        assert s.bounds is not None
        miss = s.bounds.miss_tokens
        assert miss.cold + miss.not_admitted + miss.evicted == s.input_tokens - s.hit_tokens
        assert s.hit_tokens <= s.bounds.system_bound_token_hit_rate * s.input_tokens + 1e-6
        assert s.bounds.system_bound_token_hit_rate <= s.bounds.bound_token_hit_rate + 1e-12

    def test_deterministic(self) -> None:
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system="marconi")
        a, b = (simulate(_trace(), config).summary() for _ in range(2))
        assert dataclasses.replace(a, seconds=0.0) == dataclasses.replace(b, seconds=0.0)

    def test_unbounded_cache_reaches_its_bound(self) -> None:
        s = simulate(_trace(), SimConfig(spec=PAPER_7B, capacity="1TB",
                                         system="sglang+")).summary()
        assert s.bounds is not None
        assert s.token_hit_rate == s.bounds.system_bound_token_hit_rate > 0
        assert s.bounds.miss_tokens.evicted == 0

    def test_vanilla_hits_nothing(self) -> None:
        s = simulate(_trace(), SimConfig(spec=PAPER_7B, capacity="1TB",
                                         system="vanilla")).summary()
        assert s.hit_tokens == 0 and s.peak_bytes == 0

    def test_empty_trace(self) -> None:
        s = simulate(Trace("empty", ()), SimConfig(spec=PAPER_7B, capacity="1GB",
                                                   system="marconi")).summary()
        assert s.requests == 0 and s.token_hit_rate == 0.0 and s.ttft_p95 == 0.0

    def test_a_stream_replays_like_its_trace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A generator of requests (no length known) gives the trace's records, its
        sessions and arrivals, however often its records had to grow."""
        monkeypatch.setattr("marconi.sim.replay.STREAM_ROWS", 5)  # grows 5 -> 10 -> ... -> 160
        trace = _trace()
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+",
                           replay="sequential")  # the serving replay needs the whole trace
        whole, stream = simulate(trace, config), simulate(iter(trace), config)
        assert len(trace) == 120 and len(stream.records) == 120
        for name, column in whole.records.columns().items():
            assert np.array_equal(stream.records.columns()[name], column), name
        assert stream.sessions == whole.sessions
        assert np.array_equal(stream.arrivals, whole.arrivals)
        assert stream.trace == "stream" and whole.trace == trace.name
        assert dataclasses.replace(stream.summary(), seconds=0.0, trace="") == \
            dataclasses.replace(whole.summary(), seconds=0.0, trace="")

    @pytest.mark.parametrize("system", sorted(CACHES))
    def test_the_bound_is_the_system_without_a_limit(self, system: str) -> None:
        """The same-system bound (its eviction keeping no books unless it collects
        garbage) hits what the system itself hits at that capacity, request by request."""
        trace = _trace("synthetic:agent")
        run_ = simulate(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=system,
                                         alpha=0.0, replay="sequential"))
        alone = simulate(trace, SimConfig(spec=PAPER_7B, capacity=UNBOUNDED, system=system,
                                          alpha=0.0, state_slots=0, bounds=False,
                                          replay="sequential"))
        assert alone.stats.evictions == 0
        assert np.array_equal(run_.records.bound, alone.records.hit)

    @pytest.mark.parametrize("system", ["sglang+", "marconi", "vllm-2026", "marconi+"])
    def test_the_served_bound_is_measured_on_the_run_s_own_timeline(self, system: str) -> None:
        """Served, the bound is looked up when each request is scheduled and committed when
        it finishes, beside the live cache: where that cache never evicts, the two hit
        alike, request by request, overlap and all; where it evicts, the bound never hits
        less in all."""
        trace = _trace("synthetic:agent")
        free = simulate(trace, SimConfig(spec=PAPER_7B, capacity=UNBOUNDED, system=system,
                                         alpha=0.0, state_slots=0, max_running=8))
        assert free.stats.evictions == 0 and free.summary().served.waited > 0
        assert np.array_equal(free.records.bound, free.records.hit)
        assert (free.records.seen >= free.records.hit).all()
        tight = simulate(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=system,
                                          alpha=0.0, max_running=8))
        assert tight.stats.evictions > 0
        assert tight.records.bound.sum() >= tight.records.hit.sum()

    def test_the_bound_keeps_no_eviction_books(self) -> None:
        def bound(name: str) -> PrefixCache:
            return get_system(name).cache(PAPER_7B, UNBOUNDED, state_slots=0, evict_with=keep_all)

        assert isinstance(bound("vllm+").eviction, KeepAll)
        assert isinstance(bound("marconi").eviction, KeepAll)
        assert not isinstance(bound("sglang-2026").eviction, KeepAll)  # collects garbage
        with pytest.raises(AssertionError, match="never evicts"):
            KeepAll().victim((), 0)

    @pytest.mark.parametrize("system", ["sglang-2026", "vllm-2026", "marconi"])
    def test_a_run_resolves_its_layout_once(self, system: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
        """The layout is resolved when the config is made; the caches and the summary
        read it (it was resolved again for the live cache, the bound and the summary)."""
        resolved = []
        layout = System.layout

        def counted(self: System, *args: Any, **kwargs: Any) -> Layout:
            resolved.append(self.name)
            return layout(self, *args, **kwargs)

        monkeypatch.setattr(System, "layout", counted)
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system=system)
        result = simulate(_trace(), config)
        assert result.summary().page_size == config.layout.page_size
        assert resolved == [system]

    def test_a_cache_takes_a_layout_or_its_knobs_not_both(self) -> None:
        system = get_system("sglang+")
        cache = system.cache(PAPER_7B, "1GB", layout=Layout(page_size=4, state_slots=2))
        assert cache.layout == Layout(page_size=4, state_slots=2)
        with pytest.raises(ValueError, match="not both"):
            system.cache(PAPER_7B, "1GB", layout=Layout(), page_size=4)

    @pytest.mark.parametrize("how", [{"concurrent": True, "replay": "sequential"}, {}],
                             ids=["concurrent", "serving"])
    def test_an_overlapping_replay_refuses_a_stream(self, how: dict[str, Any]) -> None:
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", **how)
        with pytest.raises(ValueError, match="whole trace"):
            simulate(iter(_trace()), config)

    def test_oracle_is_best_fixed_alpha(self) -> None:
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system=ORACLE)
        best = run(_trace(), config).summary()
        assert best.system == ORACLE and best.tuning is not None and best.tuning.report
        assert len(best.tuning.report["scores"]) == 21
        fixed = simulate(_trace(), SimConfig(spec=PAPER_7B, capacity="1GB", system="marconi",
                                             alpha=0.0)).summary()
        assert best.flops_saved >= fixed.flops_saved


class TestLatency:
    def test_flops_model(self) -> None:
        model = FlopsLatency(PAPER_7B, rate=1e14)
        t = model.ttft(np.array([1000, 1000]), np.array([0, 1000]))
        assert t[0] == pytest.approx(PAPER_7B.flops(1000) / 1e14) and t[1] == 0

    def test_profile_fit(self, tmp_path: Path) -> None:
        path = tmp_path / "p.csv"
        rows = [(t, c, 0.01 + 1e-4 * t) for t in (10, 100, 500, 1000) for c in (0, 200)]
        path.write_text("tokens_to_prefill,cached_tokens,seconds\n"
                        + "\n".join(f"{t},{c},{s}" for t, c, s in rows))
        model = ProfileLatency(path)
        assert model.ttft(np.array([700]), np.array([200]))[0] == pytest.approx(0.06, rel=1e-3)

    def test_profile_errors_name_line_and_field(self, tmp_path: Path) -> None:
        path = tmp_path / "p.csv"
        path.write_text("tokens_to_prefill,cached_tokens,seconds\n1,2,3\n4,x,6\n")
        with pytest.raises(ValueError, match=r"line 3: field 'cached_tokens'"):
            ProfileLatency(path)
        path.write_text("tokens,seconds\n1,2\n")
        with pytest.raises(ValueError, match="lacks column"):
            ProfileLatency(path)


class TestCli:
    def test_simulate_json_contract(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        records = tmp_path / "r.csv"
        code = main(["simulate", str(_artifact(tmp_path)), "--system", "sglang+", "--json",
                     "--capacity", "1GB", "--quiet", "--records", str(records)])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and all(k in out for k in CONTRACT)
        assert out["requests"] == 12 and out["hit_tokens"] > 0
        assert len(records.read_text().splitlines()) == 13

    def test_compare_table_and_plot(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        png = tmp_path / "cmp.png"
        code = main(["compare", str(_artifact(tmp_path)), "--capacity", "1GB", "--quiet",
                     "--plot", str(png)])
        out = capsys.readouterr().out
        assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"
        assert all(name in out for name in ("vanilla", "vllm+", "sglang+", "marconi"))

    def test_compare_over_seeds(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        args = ["compare", "synthetic:agent", "--sessions", "12", "--capacity", "300MB",
                "--systems", "sglang+,marconi+", "--seeds", "3", "--seed", "5", "--quiet",
                "--no-bounds"]
        assert main([*args, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["seeds"] == [5, 6, 7] and out["baseline"] == "sglang+"
        base, plus = out["systems"]
        assert len(base["flops_saved_rate"]) == 3
        assert len(set(base["flops_saved_rate"])) > 1  # the seeds move the arrivals
        diff = np.subtract(plus["flops_saved_rate"], base["flops_saved_rate"])
        vs = plus["flops_saved_vs_baseline"]
        assert vs["mean"] == pytest.approx(diff.mean())
        assert vs["low"] <= vs["mean"] <= vs["high"]
        # each seed is the single-seed replay of that seed
        assert main(["compare", "synthetic:agent", "--sessions", "12", "--capacity", "300MB",
                     "--systems", "sglang+", "--seed", "6", "--quiet", "--no-bounds",
                     "--json"]) == 0
        single = json.loads(capsys.readouterr().out)[0]
        assert single["flops_saved_rate"] == pytest.approx(base["flops_saved_rate"][1])
        png = tmp_path / "seeds.png"
        assert main([*args, "--plot", str(png)]) == 0
        table = capsys.readouterr().out
        assert "seeds 5-7" in table and "vs sglang+" in table
        assert png.read_bytes()[:4] == b"\x89PNG"

    def test_compare_seeds_on_a_trace_without_random_arrivals(
            self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        assert main(["compare", str(_artifact(tmp_path)), "--capacity", "1GB", "--quiet",
                     "--systems", "sglang+,marconi", "--seeds", "2"]) == 0
        assert "do not depend on --seed" in capsys.readouterr().out

    def test_compare_seeds_shows_refusals(self, capsys: pytest.CaptureFixture) -> None:
        # vLLM+ keeps a state every 32 tokens: at 2 GB no agent call fits, on any seed
        args = ["compare", "synthetic:agent", "--sessions", "2", "--capacity", "2GB",
                "--systems", "sglang+,vllm+", "--seeds", "2", "--quiet", "--no-bounds"]
        assert main([*args, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        sglang, vllm = out["systems"]
        assert vllm["refused_commits"] == vllm["commits"] == 80
        assert sglang["refused_commits"] == 0 and sglang["commits"] == 80
        assert main(args) == 0
        table = capsys.readouterr().out
        assert "refused (all seeds)" in table
        assert [line.split()[0] for line in table.splitlines() if " 80/80 " in line] == ["vllm+"]

        from marconi.report.plot import _label
        from marconi.report.seeds import SeedComparison

        seeds = SeedComparison(["vllm+"])
        for seed in (1, 2):
            seeds.add(seed, make_summary(system="vllm+", refused_commits=40, commits=40))
        assert _label(seeds.mean_rows()[0]) == "vllm+\nrefused\n80/80"

    def test_compare_seeds_must_be_positive(self, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
        assert main(["compare", str(_artifact(tmp_path)), "--quiet", "--seeds", "0"]) == 2
        assert "--seeds must be >= 2" in capsys.readouterr().err

    def test_analyze(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        assert main(["analyze", str(_artifact(tmp_path)), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        tax = report["reuse_taxonomy"]
        assert sum(tax.values()) == report["input_tokens"]
        assert tax["purely_input"] > 0 and tax["input_and_output"] > 0

    @pytest.mark.parametrize("args,word", [
        (["--capacity", "lots"], "bad size 'lots'"),
        (["--system", "sglang+", "--alpha", "1"], "has no alpha"),
        (["--alpha", "-1"], "--alpha: '-1' is not a number >= 0"),
        (["--model", "gpt-9"], "unknown model")])
    def test_bad_input_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture,
                               args: list[str], word: str) -> None:
        try:  # a value argparse checks ends in its one-line error, exit status 2
            code = main(["simulate", str(_artifact(tmp_path)), "--quiet", *args])
        except SystemExit as exit_:
            code = exit_.code
        assert code == 2
        assert word in capsys.readouterr().err

    def test_missing_file(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["simulate", "/no/such/trace.jsonl", "--quiet"]) == 2
        assert "/no/such/trace.jsonl" in capsys.readouterr().err


class TestAlphaReport:
    """The CLI contract: a tuned system whose tuner never finished reports alpha null
    (never 0.0 as if tuned to zero), says "untuned" in tables and warns why."""

    TRACE = "synthetic:multi-turn:sessions=20"  # 200 requests

    def _json(self, capsys: pytest.CaptureFixture, capacity: str, *more: str
              ) -> tuple[dict, str]:
        assert main(["simulate", self.TRACE, "--capacity", capacity, "--system", "marconi",
                     "--json", "--no-bounds", "--replay", "sequential", *more]) == 0
        captured = capsys.readouterr()
        return json.loads(captured.out), captured.err

    def test_a_window_past_the_trace_is_untuned(self, capsys: pytest.CaptureFixture) -> None:
        # first eviction at request 85: its window, min(5 x 85, 250), outlasts the other 115
        out, err = self._json(capsys, "4GB")
        assert out["alpha"] is None and out["alpha_status"] == "untuned"
        assert out["tuning"]["alpha"] is None and out["tuning"]["window"] == 250
        assert "never finished tuning alpha" in err and "window of 250 requests" in err
        assert "200 requests" in err

    def test_no_eviction_is_untuned_too(self, capsys: pytest.CaptureFixture) -> None:
        out, err = self._json(capsys, "12GB")
        assert out["alpha"] is None and out["evictions"] == 0
        assert "never evicted" in err

    def test_a_finished_tuning_and_a_fixed_alpha_are_numbers(
            self, capsys: pytest.CaptureFixture) -> None:
        out, err = self._json(capsys, "1GB")
        tuning = out["tuning"]
        assert out["alpha_status"] == "tuned" and isinstance(out["alpha"], float)
        # in force at the end: the last window's winner, or 0 where the guard restored it
        # since (the last adoption came before the last restore)
        last_adopted, restored = tuning["adopted"][-1][0], tuning["restored"]
        restored_since = bool(restored) and restored[-1] > last_adopted
        assert out["alpha"] == (0.0 if restored_since else tuning["alpha"])
        assert "never finished" not in err
        out, err = self._json(capsys, "1GB", "--no-retune")
        assert out["alpha"] == out["tuning"]["alpha"] and not out["tuning"]["restored"]
        out, err = self._json(capsys, "4GB", "--alpha", "0")
        assert out["alpha"] == 0.0 and out["alpha_status"] == "fixed"
        assert "never finished" not in err

    def test_a_system_without_an_alpha_reports_none(self, capsys: pytest.CaptureFixture) -> None:
        """sglang+ has no alpha: null in the JSON (and the sweep's rows), not 0.0."""
        out, _ = self._json(capsys, "1GB", "--system", "sglang+")
        assert out["system"] == "sglang+" and out["alpha"] is None
        assert out["alpha_status"] is None

    def test_tables_say_untuned(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["compare", self.TRACE, "--capacity", "4GB", "--no-bounds",
                     "--systems", "sglang+,marconi"]) == 0
        rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
                if line.startswith(("sglang+", "marconi"))}
        assert "untuned" in rows["marconi"] and "untuned" not in rows["sglang+"]
        assert rows["marconi"][6] == "untuned" and rows["sglang+"][6] == "-"  # no alpha


def test_compare_plot_labels_never_overlap() -> None:
    """Two-line labels ("vllm+ / refused 42/1235") once ran across the next system's."""
    pytest.importorskip("matplotlib")

    from marconi.report.plot import compare_figure

    rows = [{"system": name, "token_hit_rate": hit, "flops_saved_rate": hit, "ttft_p95": 0.1,
             "refused_commits": refused, "commits": 1235}
            for name, hit, refused in (("vanilla", 0.0, 0), ("vllm+", 0.03, 42),
                                       ("sglang+", 0.3, 0), ("marconi", 0.3, 0),
                                       ("marconi+", 0.39, 0))]
    long = [*rows, rows[2] | {"system": "sglang-2026-extra:strategy=extra_buffer"}]
    for fig in (compare_figure(rows, "t"), compare_figure(long, "t")):
        _no_overlap(fig)


def _no_overlap(fig: object) -> None:
    import matplotlib.pyplot as plt

    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
            for a, b in itertools.pairwise(boxes):
                assert not a.overlaps(b), (ax.get_title(), a, b)
            frame = ax.get_window_extent(renderer)
            for text in ax.texts:  # the values above the bars stay inside the frame
                assert text.get_window_extent(renderer).y1 <= frame.y1
    finally:
        plt.close(fig)


class TestEmptyInputs:
    """A request whose input is empty (a conversation opening with an empty message) is
    data, not an error: a trace built by hand with one replays, the request dropped and
    said on stderr, as the readers drop it when they load."""

    @staticmethod
    def _with_empty() -> Trace:
        trace = _trace()
        first = trace.requests[0]
        empty = dataclasses.replace(first, input_tokens=first.input_tokens[:0], whole=None)
        return Trace(trace.name, (empty, *trace.requests[1:]), dict(trace.meta))

    @pytest.mark.parametrize("system", [*CACHES, ORACLE, "offline", "reuse-oracle"])
    def test_every_system_replays_the_rest(self, system: str,
                                           capsys: pytest.CaptureFixture) -> None:
        trace = self._with_empty()
        how = "sequential" if system in REFERENCES else "serving"  # theirs: docs/architecture
        result = run(trace, SimConfig(spec=PAPER_7B, capacity="1GB", system=system,
                                      replay=how), warn=False)
        assert result.summary().requests == len(trace) - 1
        err = capsys.readouterr().err
        assert "dropped 1 request with an empty input" in err
        assert f"session {trace.requests[0].session_id!r} turn 0" in err

    def test_a_stream_says_it_when_it_ends(self, capsys: pytest.CaptureFixture) -> None:
        trace = self._with_empty()
        result = simulate(iter(trace.requests), SimConfig(spec=PAPER_7B, capacity="1GB",
                                                          system="sglang+",
                                                          replay="sequential"))
        assert result.summary().requests == len(trace) - 1
        assert "trace stream: dropped 1 request" in capsys.readouterr().err


class TestBatchedReplay:
    """Once nothing but the cache sees each request (no tuner left to feed, no bounds, no
    callback), the replay serves requests in batches (`serve_many`; the compiled core runs
    the loop): every record is what the one-by-one replay writes (a callback keeps that
    one on), on either core, across batch edges and a stream's record growth, with
    requests the compiled loop cannot take as they are (other dtypes) served on the way."""

    @staticmethod
    def _records(result: Any) -> dict[str, list[int]]:
        r = result.records
        return {**{k: getattr(r, k).tolist() for k in ("n_input", "n_output", "hit", "kv_bytes",
                                                       "ssm_bytes", "bound", "seen")},
                "sessions": list(result.sessions), "arrivals": result.arrivals.tolist()}

    @pytest.mark.parametrize("bounds", [False, True])
    @pytest.mark.parametrize("core", ["python", "compiled"])
    @pytest.mark.parametrize("system", ["vanilla", "vllm+", "sglang+", "marconi"])
    def test_batches_record_what_one_by_one_records(
            self, system: str, core: str, bounds: bool,
            monkeypatch: pytest.MonkeyPatch) -> None:
        from marconi.core.compiled import built
        from marconi.sim import replay

        if core == "compiled" and not built():
            pytest.skip("the compiled core is not built here")
        monkeypatch.setenv("MARCONI_CORE", core)
        monkeypatch.setattr(replay, "BATCH", 7)  # many batches, a partial one at the end
        monkeypatch.setattr(replay, "STREAM_ROWS", 16)  # records grow mid-batch
        trace = load_trace("synthetic:multi-turn", options=TraceOptions(sessions=20, seed=3))
        odd = [dataclasses.replace(r, input_tokens=r.input_tokens.astype(np.int64),
                                   output_tokens=r.output_tokens.astype(np.int64), whole=None)
               if i % 11 == 5 else r for i, r in enumerate(trace.requests)]
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system=system, bounds=bounds,
                           replay="sequential")  # streams, batches: the sequential replay
        served: list[int] = []
        batched = simulate(iter(odd), config)
        one_by_one = simulate(iter(odd), config, before=served.append)
        assert len(served) == len(odd) and batched.alpha == one_by_one.alpha
        assert self._records(batched) == self._records(one_by_one)
        if system == "marconi":
            assert batched.alpha_status == "tuned"  # batches began once the tuner finished

    def test_a_bad_request_in_a_batch_is_refused_as_alone(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        from marconi.sim import replay

        monkeypatch.setattr(replay, "BATCH", 4)
        trace = _trace()
        bad = trace.requests[6]
        broken = dataclasses.replace(bad, input_tokens=-bad.input_tokens - 1, whole=None)
        requests = [*trace.requests[:6], broken, *trace.requests[7:]]
        config = SimConfig(spec=PAPER_7B, capacity="1GB", system="sglang+", bounds=False,
                           replay="sequential")
        with pytest.raises(ValueError) as batched:
            simulate(iter(requests), config)
        with pytest.raises(ValueError) as alone:
            simulate(iter(requests), config, before=lambda i: None)
        assert str(batched.value) == str(alone.value)
        assert "token ids must be in [0, 2**31)" in str(alone.value)
