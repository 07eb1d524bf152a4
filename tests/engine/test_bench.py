"""engine-bench: workloads, a small run, the table and the latency profile CSV."""

from __future__ import annotations

import argparse
import csv
import itertools
import json

import numpy as np

from marconi.commands.engine_bench import register
from marconi.engines.hf.bench import (
    agent,
    bench,
    conversation,
    format_table,
    shared_prompt,
    text_tokens,
)


class TestWorkloads:
    def test_conversation_extends_its_history(self):
        turns = conversation(256, turns=3)
        for (p0, o0), (p1, _) in itertools.pairwise(turns):
            np.testing.assert_array_equal(p1[: len(p0) + len(o0)], np.concatenate([p0, o0]))

    def test_shared_prompt_shares_its_head(self):
        requests = shared_prompt(256, requests=3, system=20)
        assert all((p[:20] == requests[0][0][:20]).all() for p, _ in requests)

    def test_agent_reads_trajectories(self, tmp_path):
        folder = tmp_path / "trajs" / "x"
        folder.mkdir(parents=True)
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do"},
                    {"role": "assistant", "content": "ok"}, {"role": "user", "content": "r"},
                    {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
        (folder / "x.traj.json").write_text(json.dumps({"messages": messages}))
        calls = agent(tmp_path, 256)
        assert len(calls) == 2
        np.testing.assert_array_equal(calls[1][1], text_tokens("done", 256))
        assert len(calls[1][0]) == len("sysdookr")


class TestBench:
    def test_small_run_writes_table_and_profile(self, get_model, tmp_path, monkeypatch):
        import marconi.engines.hf.bench as module

        monkeypatch.setattr(module, "workloads", lambda model, agent_dir: {
            "conversation": conversation(256, turns=3, user=20, reply=4)})
        said: list[str] = []
        rows = bench(get_model("bamba"), None, ["vanilla", "sglang+"], "1GB", True,
                     tmp_path / "profile.csv", repeat=2, say=said.append)
        # progress: a line as each of the 6 steps starts, between warming up and done
        assert said[0].startswith("engine-bench: warming up (")
        assert said[1].startswith("engine-bench: step 1 of 6, run 1 of 2: conversation ")
        assert said[6].startswith("engine-bench: step 6 of 6, run 2 of 2: conversation, "
                                  "sglang+, chunk-boundary capture (")
        assert said[7].startswith("engine-bench: done (") and len(said) == 8
        assert [r.system for r in rows] == ["vanilla", "sglang+", "sglang+/chunk"] * 2
        assert [r.repeat for r in rows] == [0, 0, 0, 1, 1, 1]
        assert rows[0].hit_tokens == 0 and rows[1].hit_tokens > 0
        table = format_table(rows)
        assert "sglang+/chunk" in table and len(table.splitlines()) == 4
        with (tmp_path / "profile.csv").open() as handle:
            table = list(csv.DictReader(handle))
        assert set(table[0]) == {"tokens_to_prefill", "cached_tokens", "seconds"}
        assert len(table) == 12  # both repetitions' exact runs

    def test_the_command_tells_its_progress_on_stderr(self, get_model, tmp_path, monkeypatch,
                                                      capsys):
        import marconi.engines.hf.bench as module
        from marconi.cli import main

        monkeypatch.setattr(module, "workloads", lambda model, agent_dir: {
            "conversation": conversation(256, turns=2, user=20, reply=4)})
        assert main(["engine-bench", "--systems", "vanilla", "--repeat", "1", "--no-chunk",
                     "--profile", str(tmp_path / "p.csv")]) == 0
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith("engine-bench: warming up (")
        assert err[1].startswith("engine-bench: step 1 of 1, run 1 of 1: conversation (2 "
                                 "requests), vanilla (")

    def test_help_says_what_the_command_does_not_how_it_is_wired(self):
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command"))
        text = parser._subparsers._group_actions[0].choices["engine-bench"].format_help()
        assert "TTFT" in text and "register(" not in text and "Wired" not in text

    def test_register(self):
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["engine-bench", "--systems", "vanilla", "--set", "x=1"])
        assert args.systems == "vanilla" and args.set == ["x=1"] and callable(args.func)


def test_a_missing_agent_folder_is_an_error(tmp_path, capsys):
    from marconi.cli import main

    assert main(["engine-bench", "--agent-data", str(tmp_path / "nope"), "--systems",
                 "vanilla"]) == 2
    assert f"--agent-data {tmp_path / 'nope'}: no such folder" in capsys.readouterr().err
