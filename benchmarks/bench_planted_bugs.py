"""Planted engine bugs: which tests kill each one, per model family.

Each bug below is one textual edit of the engine's source, planted in a fresh copy of
the commit at HEAD when the run starts (the working tree is never touched) and judged
by the engine's whole test suite (`tests/engine`). A bug is killed on a family when at
least `--need` (2) independent tests fail there: distinct test functions, the
parametrizations of one function counting once. A test whose id names no family runs
the default tiny model and counts for `bamba` alone. Families where a bug cannot act
are declared with the reason (a decode position is invisible to a family whose
attention has no positional encoding); a bug that survives anywhere else fails the run.

    .venv/bin/python benchmarks/bench_planted_bugs.py [--only NAME ...] [--need 2]
        [--no-baseline] [--keep]

Prints one row per bug (the tests that killed it, per family) and last
`planted bugs: K/N killed by >= 2 tests on every family where they apply`. About four
minutes a bug on an idle 2-core machine. Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO

from marconi.core.families import ENGINE_FAMILIES as FAMILIES

NO_POSITIONS = ("nemotron_h", "granitemoehybrid", "zamba2")  # attention without RoPE


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    path: str  # under src/marconi/
    old: str  # must occur exactly once
    new: str
    immune: tuple[str, ...] = ()  # families the bug cannot act on
    why_immune: str = ""
    families: tuple[str, ...] = field(default=FAMILIES)

    def applies(self) -> tuple[str, ...]:
        return tuple(f for f in self.families if f not in self.immune)


BUGS = (
    Bug("recurrent state not restored", "engines/hf/state.py",
        "_held(layer.recurrent_states[0]).copy_(recurrent[None])",
        "_held(layer.recurrent_states[0]).zero_()"),
    Bug("conv state not restored", "engines/hf/state.py",
        "_held(layer.conv_states[0]).copy_(conv[None])",
        "_held(layer.conv_states[0]).zero_()"),
    Bug("capture one token late", "engines/hf/prefill.py",
        "            p = (p // chunk) * chunk\n",
        "            p = (p // chunk) * chunk\n        elif mode is Capture.EXACT:\n"
        "            p = min(p + 1, end)\n"),
    Bug("decode position off by one", "engines/hf/engine.py",
        "torch.tensor([token]), n_input + step)",
        "torch.tensor([token]), n_input + step + 1)",
        immune=NO_POSITIONS, why_immune="attention without positional encoding"),
    Bug("stale stored logits", "engines/hf/engine.py",
        "snapshot_state(self.model, result.cache, end, step_logits)",
        "snapshot_state(self.model, result.cache, end, logits[-1])"),
    Bug("KV blocks joined in reverse", "engines/hf/state.py",
        "    layers = range(len(blocks[0].keys))\n",
        "    layers = range(len(blocks[0].keys))\n    blocks = list(reversed(blocks))\n"),
    Bug("split tail shifted by one", "engines/hf/tensor_store.py",
        "return kv.slice(0, at), kv.slice(at, kv.tokens)",
        "return kv.slice(0, at), kv.slice(at - 1, kv.tokens - 1)"),
    Bug("paged page released twice", "engines/hf/paged_store.py",
        "            self.pool.release(kv)\n",
        "            self.pool.release(kv)\n            self.pool.release(kv)\n"),
    Bug("hit one token past its state", "engines/hf/engine.py",
        "cache, plan.hit, wanted,",
        "cache, plan.hit + (0 < plan.hit < n_input - 1), wanted,"),
)


def head() -> str:
    """The commit every copy is taken from (resolved once: commits made during the run
    do not change what it measures)."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def copy_of(commit: str, into: Path) -> None:
    """The commit's `src/` and `tests/` (and what the tests read) in `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src", "tests",
                              "examples", "pyproject.toml"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def plant(root: Path, bug: Bug) -> None:
    path = root / "src" / "marconi" / bug.path
    text = path.read_text()
    if text.count(bug.old) != 1:
        raise SystemExit(f"bench_planted_bugs: {bug.name!r}: the text to edit occurs "
                         f"{text.count(bug.old)} times in src/marconi/{bug.path}, not once "
                         "(the source moved: update the bug)")
    path.write_text(text.replace(bug.old, bug.new))


def run_suite(root: Path, timeout: float) -> tuple[list[str], int, float]:
    """Failed test ids, tests run, seconds."""
    report = root / "report.xml"
    env = {"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin",
           "HOME": str(root), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "pytest", "tests/engine", "-q",
                        "-p", "no:cacheprovider", f"--junitxml={report}"],
                       cwd=root, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ["(timed out)"], 0, time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if not report.exists():
        return ["(no report)"], 0, seconds
    failed, total = [], 0
    for case in ET.parse(report).getroot().iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed, total, seconds


def by_family(failed: list[str]) -> dict[str, set[str]]:
    """Failed test functions per family (parametrizations of one function: one test)."""
    out: dict[str, set[str]] = defaultdict(set)
    for test in failed:
        function, _, params = test.partition("[")
        named = [f for f in FAMILIES if f in params]
        for family in named or ["bamba"]:  # unnamed: the default tiny model
            out[family].add(function.removeprefix("tests.engine."))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="bug names (default: all)")
    parser.add_argument("--need", type=int, default=2, help="tests that must kill a bug")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unplanted run (it must pass for the table to mean much)")
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per suite run")
    args = parser.parse_args(argv)
    bugs = [b for b in BUGS if not args.only or b.name in args.only]
    if args.only and len(bugs) != len(args.only):
        known = ", ".join(repr(b.name) for b in BUGS)
        raise SystemExit(f"bench_planted_bugs: unknown bug in --only; known: {known}")
    work, commit = Path(tempfile.mkdtemp(prefix="planted-")), head()
    print(f"planting in copies of {commit[:12]}", flush=True)
    try:
        if not args.no_baseline:
            base = work / "baseline"
            base.mkdir()
            copy_of(commit, base)
            failed, total, seconds = run_suite(base, args.timeout)
            print(f"baseline: {total} tests, {len(failed)} failed, {seconds:.0f} s", flush=True)
            if failed:
                print("  the unplanted suite fails; the table would mean nothing:", failed[:5])
                return 1
        killed = 0
        for i, bug in enumerate(bugs):
            root = work / f"bug{i}"
            root.mkdir()
            copy_of(commit, root)
            plant(root, bug)
            failed, total, seconds = run_suite(root, args.timeout)
            families = by_family(failed)
            short = {f: len(families.get(f, ())) for f in bug.applies()}
            ok = all(n >= args.need for n in short.values())
            killed += ok
            cells = " ".join(f"{f}={n}" for f, n in short.items())
            immune = f"; immune: {', '.join(bug.immune)} ({bug.why_immune})" if bug.immune else ""
            print(f"{bug.name:<30} {'killed' if ok else 'SURVIVED':<8} "
                  f"{len(failed):>3} of {total} tests failed in {seconds:.0f} s; "
                  f"tests per family: {cells}{immune}", flush=True)
            functions = sorted({t.split('[')[0].removeprefix('tests.engine.') for t in failed})
            print(f"    killed by: {', '.join(functions) or '-'}", flush=True)
        print(f"planted bugs: {killed}/{len(bugs)} killed by >= {args.need} tests on every "
              "family where they apply")
        return 0 if killed == len(bugs) else 1
    finally:
        if args.keep:
            print(f"copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
