"""Replay time of this tree against a baseline revision, runs alternated on one trace.

    .venv/bin/python benchmarks/bench_replay_ab.py --baseline REV TRACE [--format F]
        [--systems vllm+,marconi+] [--capacity 20GB] [--runs 3] [--no-bounds]
        [--artifact]

Each run is `marconi simulate TRACE --system S --capacity C --json --quiet` in a fresh
process, with `src` of this tree or of REV (a temporary git worktree) first on
PYTHONPATH; baseline and this tree alternate, so both see the machine's speed of the
moment (it drifts by 20-30% from one hour to the next here). Printed per run: the
replay's seconds (`simulate --json`), the process's user CPU seconds, and, for marconi+,
the seconds its shadows took; the last column says whether every figure of the summary
but the timings equals the baseline's (keys only this tree reports are named).
`--artifact` first writes the SWE-agent trajectories as the paper artifact's token-id
JSONL (a trace with no message boundary) and replays that instead of TRACE.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, TRAJS, worktree, write_agent_trace


def run(src: Path, trace: str, fmt: str | None, system: str, capacity: str,
        no_bounds: bool) -> tuple[dict[str, Any], float]:
    """One replay in a fresh process: its summary and the child's user CPU seconds."""
    cmd = [sys.executable, "-m", "marconi", "simulate", trace, "--system", system,
           "--capacity", capacity, "--json", "--quiet",
           *(["--format", fmt] if fmt else []), *(["--no-bounds"] if no_bounds else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (PYTHONPATH={src}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout), resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before


def same(now: dict[str, Any], then: dict[str, Any]) -> str:
    """Whether every figure both summaries report, but the timings (`seconds`, and the
    tuner's own), is equal; keys only this tree reports are named, not compared."""
    def flat(summary: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in summary.items() if k != "tuning"}
        tuning = summary.get("tuning")
        if isinstance(tuning, dict):
            out |= {f"tuning.{k}": v for k, v in tuning.items()}
        return {k: v for k, v in out.items() if k not in ("seconds", "tuning.seconds")}

    a, b = flat(now), flat(then)
    differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    new = sorted(a.keys() - b.keys())
    return (f"DIFFER: {', '.join(differ)}" if differ else "identical") + (
        f" (new: {', '.join(new)})" if new else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(TRAJS))
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--format", help="the trace's format (default: swe-agent for the "
                        "trajectories, else inferred)")
    parser.add_argument("--systems", default="vllm+,marconi+")
    parser.add_argument("--capacity", default="20GB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-bounds", action="store_true")
    parser.add_argument("--artifact", action="store_true",
                        help="replay the trajectories as the artifact's JSONL")
    args = parser.parse_args()
    fmt = args.format or ("swe-agent" if args.trace == str(TRAJS) else None)
    with tempfile.TemporaryDirectory() as tmp, worktree(args.baseline) as base:
        assert base is not None
        trace = args.trace
        if args.artifact:
            trace, fmt = str(Path(tmp) / "agent.jsonl"), "artifact"
            write_agent_trace(Path(trace), REPO / "src")
        print(f"# {platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"# {trace} ({fmt or 'inferred'}), {args.capacity}, "
              f"{'no bounds' if args.no_bounds else 'bounds on'}; baseline {args.baseline}")
        print(f"{'system':10} {'run':>3} {'tree':>8} {'replay s':>9} {'user s':>7} "
              f"{'shadows s':>9}  figures")
        for system in args.systems.split(","):
            for k in range(1, args.runs + 1):
                then = None
                for label, src in (("baseline", base), ("now", REPO / "src")):
                    summary, cpu = run(src, trace, fmt, system, args.capacity, args.no_bounds)
                    tuning = summary.get("tuning")
                    shadows = (f"{tuning['seconds']:9.2f}" if isinstance(tuning, dict)
                               and "totals" in tuning else f"{'':9}")
                    verdict = "" if then is None else same(summary, then)
                    then = summary if then is None else then
                    print(f"{system:10} {k:>3} {label:>8} {summary['seconds']:9.2f} "
                          f"{cpu:7.2f} {shadows}  {verdict}", flush=True)
        print(f"# load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    main()
