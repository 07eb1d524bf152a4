"""Golden check: every figure of `marconi compare --json` at this tree against a baseline.

    .venv/bin/python benchmarks/bench_golden.py --baseline REV [--systems a,b] [--quick]
    .venv/bin/python benchmarks/bench_golden.py --cores [--systems a,b] [--quick]

A change meant to move no figure (a refactor, speed work) is checked here: each trace
below is replayed through every system at two capacities, in the serving replay (the
default; `offline`, a reference of the sequential replay, left out) and in the
sequential one, once with this tree's `src`
and once with REV's (a temporary git worktree), each in a fresh process, and every key
of every summary but `seconds` is compared. It prints one line per (trace, capacity):
identical, or the systems and keys that differ with both values; the last line says how
many differ (keys only this tree reports are listed, not compared). The trajectories
come from the shared data folder and are skipped without it; `--quick` keeps the
synthetic traces only. `--cores` compares this tree with itself instead, on the compiled
core (`MARCONI_CORE=compiled`) against the Python core, its oracle (docs/architecture.md,
"The compiled core"): the systems the compiled core does not run come out identical
trivially.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import REPO, TRAJS, worktree

SYSTEMS = ("vanilla,vllm+,sglang+,marconi,marconi+,sglang-2026,sglang-2026-extra,vllm-2026,"
           "marconi-inverse-age,offline")
IGNORED = {"seconds"}
ADDED: set[str] = set()  # keys only this tree's summaries have


def workloads(quick: bool) -> list[tuple[str, list[str], tuple[str, ...]]]:
    """(label, trace arguments, capacities)."""
    out = [("synthetic:agent", ["synthetic:agent", "--sessions", "30"], ("1GB", "20GB")),
           ("synthetic:multi-turn", ["synthetic:multi-turn", "--sessions", "60"],
            ("300MB", "2GB"))]
    if not quick:
        out.insert(0, ("sharegpt", ["sharegpt"], ("1GB", "5GB")))
        if TRAJS.is_dir():
            out.append(("swe-agent", [str(TRAJS), "--format", "swe-agent", "--sessions",
                                      "40"], ("2GB", "20GB")))
    return out


REPLAYS = ("serving", "sequential")


def for_replay(systems: str, replay: str) -> str:
    """The systems a replay runs: the serving replay refuses `offline`."""
    names = systems.split(",")
    return ",".join(n for n in names if replay == "sequential" or n != "offline")


def compare(src: Path, args: list[str], capacity: str, systems: str,
            core: str | None = None) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    if core is not None:
        env["MARCONI_CORE"] = core
    cmd = [sys.executable, "-m", "marconi", "compare", *args, "--capacity", capacity,
           "--systems", systems, "--json", "--quiet"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (PYTHONPATH={src}) failed:\n{out.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def differences(now: dict[str, Any], then: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ (nested dicts walked), `seconds` ignored; a key new in
    this tree is an addition, not a moved figure (`added`)."""
    out = []
    for key in sorted(set(now) | set(then)):
        if key in IGNORED:
            continue
        if key not in then:
            ADDED.add(prefix + key)
            continue
        a, b = now.get(key, "<absent>"), then.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {b!r:.60} -> {a!r:.60}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline", help="the git revision to compare with")
    which.add_argument("--cores", action="store_true",
                       help="this tree on the compiled core against its Python core")
    parser.add_argument("--systems", default=SYSTEMS)
    parser.add_argument("--quick", action="store_true", help="synthetic traces only")
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    against = "its Python core (compiled now)" if args.cores else args.baseline
    print(f"# golden check: this tree (HEAD {head} + working changes) against "
          f"{against}; systems {args.systems}", flush=True)
    differing = 0
    with worktree(None if args.cores else args.baseline) as base:
        for (label, trace, capacities), replay in (
                (w, r) for w in workloads(args.quick) for r in REPLAYS):
            trace = [*trace, "--replay", replay]
            systems = for_replay(args.systems, replay)
            for capacity in capacities:
                if args.cores:
                    now = compare(REPO / "src", trace, capacity, systems, "compiled")
                    then = compare(REPO / "src", trace, capacity, systems, "python")
                else:
                    assert base is not None
                    now = compare(REPO / "src", trace, capacity, systems)
                    then = compare(base, trace, capacity, systems)
                lines = []
                for a, b in zip(now, then, strict=True):
                    lines += [f"  {a['system']}: {d}" for d in differences(a, b)]
                differing += bool(lines)
                print(f"{label} at {capacity}, {replay}: "
                      + ("identical" if not lines else "DIFFERS"),
                      flush=True)
                for line in lines:
                    print(line)
    if ADDED:
        print(f"keys new in this tree (not compared): {', '.join(sorted(ADDED))}")
    print(f"{differing} of the (trace, capacity) pairs differ")


if __name__ == "__main__":
    main()
