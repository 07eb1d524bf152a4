"""What the benchmark scripts share: where the repository and the shared data are, the
named traces they replay, a temporary worktree of a baseline revision, and the agent
trajectories written as the paper artifact's JSONL.

Each script runs alone (`python benchmarks/X.py`): its own folder is first on sys.path,
so `from common import ...` finds this module; no script imports another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from marconi.workload import Trace

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"  # the shared data folder beside the repository
TRAJS = DATA / "mini-swe-agent" / "trajs"  # the mini-swe-agent trajectories
MOONCAKE = DATA / "mooncake" / "conversation_trace.jsonl"


def load(name: str) -> Trace | None:
    """A named trace, or None when its data is absent: `sharegpt` (the first 100
    sessions of >= 10 rounds), `sharegpt(N)` (the first N), `swe-agent` (the
    trajectories), `mooncake[A:B]` (requests A..B of the conversation trace)."""
    # imported here: the tooling scripts run marconi only in child processes, each with
    # its own tree's `src` first on PYTHONPATH, and never import it themselves
    from marconi.workload import Trace, TraceOptions, load_trace

    if name.startswith("sharegpt"):
        sessions = int(name[9:-1]) if "(" in name else 100
        return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=sessions))
    if name == "swe-agent":
        return load_trace(TRAJS) if TRAJS.exists() else None
    if not MOONCAKE.exists():
        return None
    a, b = (int(x) for x in name[9:-1].split(":"))
    full = load_trace(MOONCAKE)
    return Trace(name, full.requests[a:b], full.meta)


@contextmanager
def worktree(rev: str | None) -> Iterator[Path | None]:
    """The `src` folder of a temporary git worktree at `rev` (None: yields None), removed
    on exit."""
    if rev is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            yield tree / "src"
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)


AGENT_JSONL = """
import json, sys
from marconi.workload.registry import load_trace
from marconi.workload.options import TraceOptions
trace = load_trace(sys.argv[1], format="swe-agent", options=TraceOptions(sessions=None,
                   use_cache=False))
with open(sys.argv[2], "w") as f:
    for r in trace:
        f.write(json.dumps({"session_id": r.session_id, "turn_id": r.turn, "ts": r.arrival,
                            "input_tokens": r.input_tokens.tolist(),
                            "output_tokens": r.output_tokens.tolist()}) + "\\n")
"""


def write_agent_trace(path: Path, src: Path) -> None:
    """The mini-swe-agent trajectories as the paper artifact's JSONL (token ids), written
    by a fresh process with `src` first on PYTHONPATH."""
    subprocess.run([sys.executable, "-c", AGENT_JSONL, str(TRAJS), str(path)], check=True,
                   env={**os.environ, "PYTHONPATH": str(src)})
