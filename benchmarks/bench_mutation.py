"""Mutation score of the core: how many planted bugs (mutmut's mutants) the tests kill.

Mutated: the cache, tree, eviction mechanics, policy protocols and books, the evaluators
of declared scores (`core.scores`, `core.candidates`), the paper's admission and eviction
policies, and the engine's prefill, state snapshots and tensor
store (docs/architecture.md, "Modules"). mutmut rewrites the files it mutates, so the
whole run happens in a temporary copy of `src/` and `tests/`: the working tree is never
touched; by default the copy is of HEAD, so uncommitted edits do not move the figure.
Prints one row per module, the survivors, and last
`mutation score: KILLED/TOTAL killed` (a timeout counts as killed: the tests noticed).

    .venv/bin/python benchmarks/bench_mutation.py [--quick] [--only core|engine]
        [--max-children 2] [--keep] [--worktree]

Two groups, each in its own copy: the core's mutants against the core's fast tests (the
property tests' list references, not their 18-second stateful machine), the engine's
against a bounded selection of engine tests (two of the fuzz's cases among them): every
surviving mutant reruns all the selected tests that cover its function, so the
selections bound the wall time (under 30 minutes on an idle 2-core machine).
`--quick` mutates a CI-sized sample (the tree and the paper's admission) against the fast
core tests only. Figures and the survivors judged equivalent: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import REPO

FUZZ = "tests/engine/test_fuzz.py::test_cached_runs_equal_a_plain_forward_under_pressure"


@dataclass(frozen=True, slots=True)
class Group:
    """Modules mutated together and the tests that judge them: the core against its own
    fast tests, the engine against a bounded engine selection (every mutant that survives
    reruns all the tests covering its function, so the selection bounds the wall time)."""

    name: str
    modules: tuple[str, ...]  # under src/marconi/
    tests: tuple[str, ...]  # pytest paths or node ids


CORE_MODULES = ("cache", "tree", "evicting", "policy", "stats", "columns", "lazy_heap",
                "scores", "candidates")
CORE_TESTS = ("tree", "columns", "cache", "policies", "core_exact", "peek", "namespaces",
              "lazy_heap", "scores", "baselines")  # (baselines: SegLen's `replay_length`)
PROPERTIES = "tests/test_cache_properties.py"  # its stateful machine (18 s) is left out
CORE = Group("core", (*(f"core/{m}.py" for m in CORE_MODULES), "paper/admission.py",
                      "paper/eviction.py"),
             (*(f"tests/test_{m}.py" for m in CORE_TESTS),
              f"{PROPERTIES}::test_judicious_matches_list_reference",
              f"{PROPERTIES}::test_block_admission_matches_list_reference"))
ENGINE = Group("engine", tuple(f"engines/hf/{m}.py" for m in ("prefill", "state", "tensor_store")),
               ("tests/engine/test_engine_exact.py", "tests/engine/test_edits.py",
                "tests/engine/test_exactness.py::TestRestore",
                "tests/engine/test_exactness.py::TestChunkCapture",
                "tests/engine/test_exactness.py::TestExactRepeat",
                "tests/engine/test_store.py::TestRelease",
                f"{FUZZ}[bamba-chunk-sglang-2026-paged]",
                f"{FUZZ}[qwen3_next-exact-marconi-inverse-age-tensor]"))
QUICK = Group("quick", ("core/tree.py", "paper/admission.py"),
              ("tests/test_tree.py", "tests/test_policies.py", "tests/test_cache.py",
               "tests/test_core_exact.py"))
KILLED = {"killed", "timeout", "segfault"}  # the tests noticed the mutant


def copy_tree(work: Path, worktree: bool) -> None:
    """src/, tests/ and pyproject.toml (pytest's settings) into `work`: as committed at
    HEAD (a reproducible figure), or as they are in the working tree."""
    if not worktree:
        archive = subprocess.run(["git", "archive", "HEAD", "src", "tests", "pyproject.toml"],
                                 cwd=REPO, check=True, stdout=subprocess.PIPE).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        return
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in ("src", "tests"):
        shutil.copytree(REPO / name, work / name, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")


def write_config(work: Path, group: Group) -> None:
    """mutmut reads setup.cfg when pyproject.toml has no [tool.mutmut]: the copy's only."""
    lines = ["[mutmut]", "source_paths = src/marconi", "process_isolation = forkserver",
             "only_mutate ="]
    lines += [f"    src/marconi/{m}" for m in group.modules]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in group.tests]
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider"]
    # a mutant still running after 4 x (its tests' time + 10 s) of wall time is stopped
    # (and counted a timeout): room for a loaded machine, not mutmut's 15x per looping mutant
    lines += ["timeout_multiplier = 4", "timeout_constant = 10"]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


def mutmut(work: Path, *args: str) -> str:
    """Run the mutmut next to this Python in `work` (torch kept to one thread per worker);
    its output, or its last lines and an error if it fails."""
    exe = Path(sys.executable).with_name("mutmut")
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": ""}
    out = subprocess.run([str(exe), *args], cwd=work, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if out.returncode != 0:
        print(out.stdout[-3000:], file=sys.stderr)
        raise SystemExit(f"mutmut {args[0]} failed with exit code {out.returncode}")
    return out.stdout


def statuses(work: Path) -> dict[str, str]:
    """Every mutant's name and verdict (`mutmut results --all true`)."""
    out: dict[str, str] = {}
    for line in mutmut(work, "results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("marconi."):
            out[name] = status.strip()
    return out


def module_of(mutant: str, modules: Sequence[str]) -> str:
    """The module file a mutant name (`marconi.core.tree.xǁRadixTreeǁsplit__mutmut_3`) is in."""
    for module in modules:
        dotted = "marconi." + module.removesuffix(".py").replace("/", ".") + "."
        if mutant.startswith(dotted):
            return module
    return "?"


def print_table(verdicts: dict[str, str], modules: Sequence[str]) -> None:
    """One row per module: killed, survived, not covered by any selected test, total."""
    rows: dict[str, Counter[str]] = {m: Counter() for m in modules}
    for name, status in verdicts.items():
        rows.setdefault(module_of(name, modules), Counter())[status] += 1
    print(f"{'module':24} {'killed':>7} {'survived':>9} {'no tests':>9} {'total':>6}")
    for module, c in rows.items():
        killed = sum(c[s] for s in KILLED)
        print(f"{module:24} {killed:7d} {c['survived']:9d} {c['no tests']:9d} "
              f"{sum(c.values()):6d}")


def report(verdicts: dict[str, str], modules: Sequence[str]) -> tuple[int, int]:
    """Print the table and every mutant not killed; returns (killed, total)."""
    unrun = [n for n, s in verdicts.items() if s == "not checked"]  # an interrupted run
    verdicts = {n: s for n, s in verdicts.items() if s != "not checked"}
    print_table(verdicts, modules)
    survivors = sorted(n for n, s in verdicts.items() if s not in KILLED)
    print(f"\nnot killed ({len(survivors)}; `mutmut show NAME` in a --keep copy shows one):")
    for name in survivors:
        print(f"  {name}: {verdicts[name]}")
    if unrun:
        print(f"not run (left out of the score): {len(unrun)}")
    return sum(1 for s in verdicts.values() if s in KILLED), len(verdicts)


def run_group(group: Group, worktree: bool, children: int, keep: bool) -> dict[str, str]:
    """Every verdict of one group's mutants, from its own temporary copy."""
    work = Path(tempfile.mkdtemp(prefix=f"marconi-mutation-{group.name}-"))
    try:
        copy_tree(work, worktree)
        write_config(work, group)
        mutmut(work, "run", "--max-children", str(children))
        return statuses(work)
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a CI-sized sample")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies")
    parser.add_argument("--worktree", action="store_true",
                        help="mutate the working tree's files instead of HEAD's")
    parser.add_argument("--only", choices=[CORE.name, ENGINE.name], help="one group")
    args = parser.parse_args(argv)
    groups = [QUICK] if args.quick else [g for g in (CORE, ENGINE) if args.only in (None, g.name)]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                          text=True, stdout=subprocess.PIPE).stdout.strip()
    t0, verdicts = time.perf_counter(), {}
    for group in groups:
        verdicts |= run_group(group, args.worktree, args.max_children, args.keep)
    killed, total = report(verdicts, [m for g in groups for m in g.modules])
    print(json.dumps({"groups": [g.name for g in groups],
                      "source": "working tree" if args.worktree else head,
                      "seconds": round(time.perf_counter() - t0)}))
    print(f"mutation score: {killed}/{total} killed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
