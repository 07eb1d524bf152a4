"""The scripts of benchmarks/ and experiments/: each runs alone, shares helpers through its
folder's `common.py` only, and marconi+'s variants load as a plugin whose systems resolve
by name (docs/architecture.md, "Benchmarks and experiments")."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "experiments")
# the one script another may import: the plugin whose classes bench_plus_why subclasses
PLUGIN = "bench_plus_variants"


def _scripts(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).glob("*.py") if p.name != "common.py")


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("folder", FOLDERS)
def test_scripts_share_helpers_through_common_only(folder: str) -> None:
    scripts = _scripts(folder)
    assert scripts
    siblings = {p.stem for p in scripts}
    for path in scripts:
        others = _imported(path) & siblings - {path.stem}
        allowed = {PLUGIN} if folder == "experiments" else set()
        assert others <= allowed, f"{path.name} imports {sorted(others)}; share via common.py"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_script_is_documented(folder: str) -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Benchmarks and experiments"):]
    missing = [p.name for p in _scripts(folder) if f"`{p.name}" not in section]
    assert not missing, f"docs/architecture.md lists no {missing}"


def test_variant_plugins_register_systems_that_resolve_by_name() -> None:
    """Loaded by path, as `--plugin` does, from another directory: every system the
    experiments' plugins register is found again by its name (a `:` would start options)."""
    code = """
import json, sys
from marconi.systems import SYSTEMS, get_system, load_plugin
before = set(SYSTEMS)
load_plugin(sys.argv[1])
new = sorted(set(SYSTEMS) - before)
print(json.dumps([n for n in new if get_system(n).name == n]))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "experiments" /
                                                            "bench_plus_why.py")],
                         capture_output=True, text=True, env=env, cwd="/", check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    names = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"why/density", "why/no prior exposure", "why/marconi+", "lead 1%",
            "gd level frozen"} <= set(names)


def _report(tmp_path: Path, lines: list[str],
            more: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    files = []
    for i, content in enumerate([lines] + ([more] if more is not None else [])):
        runs = tmp_path / ("runs.jsonl" if i == 0 else f"more{i}.jsonl")
        runs.write_text("\n".join(content) + "\n")
        files.append(str(runs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, str(REPO / "experiments" / "bench_plus_unseen.py"),
                           "--report", *files], capture_output=True, text=True, env=env,
                          cwd=tmp_path, check=False)


def test_unseen_report_compares_marconi_plus_with_online_systems_only(tmp_path: Path) -> None:
    """The best online system leaves out the references that read the future and marconi+'s
    own ablations, however much they save; the gap is closed towards reuse-oracle."""
    saved = {"sglang+": 0.10, "seglen": 0.14, "marconi+": 0.16, "marconi+-depth": 0.30,
             "marconi-oracle": 0.40, "reuse-oracle": 0.20, "offline": 0.50}
    out = _report(tmp_path, [json.dumps({"config": "c|1GB", "system": s, "saved": v})
                             for s, v in saved.items()])
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| c 1GB |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 11  # the configuration's bar does not split its cell
    assert cells[1:6] == ["2", "seglen 14.00", "16.00", "+2.00", "marconi+-depth 30.00"]
    assert cells[7] == "+0.33 / +0.60"  # (16 - 14) / (20 - 14), (16 - 10) / (20 - 10)
    assert "above the best online system on 1 of 1" in out.stdout
    assert "ablations as systems too: more than 0.2 point below on 1 of 1 (worst -14.00)" \
        in out.stdout
    assert "no upper reference" not in out.stdout


def test_unseen_report_says_when_reuse_oracle_is_no_upper_reference(tmp_path: Path) -> None:
    saved = {"sglang+": 0.10, "sparse-prefix": 0.34, "marconi+": 0.32,
             "marconi-oracle": 0.19, "reuse-oracle": 0.15, "offline": 0.59}
    out = _report(tmp_path, [json.dumps({"config": "m|80GB", "system": s, "saved": v})
                             for s, v in saved.items()])
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("warning: m 80GB: reuse-oracle saves 15.00%, less than sparse-prefix's 34.00%: "
            "it is no upper reference here") in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("| m 80GB |"))
    assert "| - / - |" in row


def test_unseen_report_names_the_bad_line(tmp_path: Path) -> None:
    good = json.dumps({"config": "c|1GB", "system": "sglang+", "saved": 0.1})
    out = _report(tmp_path, [good, '{"config": "c|1GB", "saved": 0.2}'])
    assert out.returncode != 0
    assert "runs.jsonl:2: not a run of this script" in out.stderr
    assert "Traceback" not in out.stderr
    out = _report(tmp_path, [good])
    assert out.returncode != 0 and "runs missing: c|1GB: marconi+" in out.stderr
    served = json.dumps({"config": "c|1GB", "system": "marconi+", "saved": 0.2,
                         "replay": "serving"})
    out = _report(tmp_path, [good, served])
    assert out.returncode != 0 and "runs.jsonl:2: a serving run" in out.stderr
    assert "Traceback" not in out.stderr


def test_unseen_refuses_the_future_references_served() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, str(REPO / "experiments" / "bench_plus_unseen.py"),
                          "--set", "design", "--all", "--replay", "serving"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 2 and "refuse the serving replay" in out.stderr


def test_unseen_report_takes_variants_as_candidates_not_peers(tmp_path: Path) -> None:
    """A variant of the plugin, from a second file, is scored against the best peer like
    marconi+, and never becomes that peer itself."""
    first = {"sglang+": 0.10, "seglen": 0.14, "marconi+": 0.16,
             "marconi-oracle": 0.40, "reuse-oracle": 0.20, "offline": 0.50}
    second = {"sglang+": 0.10, "lead 1%": 0.15}
    out = _report(tmp_path, [json.dumps({"config": "c|1GB", "system": s, "saved": v})
                             for s, v in first.items()],
                  [json.dumps({"config": "c|1GB", "system": s, "saved": v})
                   for s, v in second.items()])
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| c 1GB |"))
    assert "| seglen 14.00 |" in row
    lines = out.stdout.splitlines()
    assert "| lead 1% | 15.00 | 0 of 1 / +1.00 / +1.00 |" in lines
    assert "| marconi+ | 16.00 | 0 of 1 / +2.00 / +2.00 |" in lines
    assert "| seglen | 14.00 |  |" in lines  # a peer has no margin to itself


def test_unseen_report_refuses_runs_that_disagree(tmp_path: Path) -> None:
    line = {"config": "c|1GB", "system": "sglang+", "saved": 0.1}
    out = _report(tmp_path, [json.dumps(line)], [json.dumps({**line, "saved": 0.2})])
    assert out.returncode != 0
    assert "more1.jsonl:1: sglang+ on c|1GB saved 0.2 here and 0.1" in out.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_test_sh_help_prints_its_usage_at_once(flag: str, tmp_path: Path) -> None:
    """`--help` answers before anything is installed or linted: run from a copy with no
    setup.sh beside it, so reaching setup would fail, and under a short timeout."""
    script = tmp_path / "scripts" / "test.sh"
    script.parent.mkdir()
    script.write_text((REPO / "scripts" / "test.sh").read_text())
    done = subprocess.run(["bash", str(script), flag], capture_output=True, text=True,
                          timeout=10)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: bash scripts/test.sh"), done.stdout


def test_the_floors_run_fewer_random_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/test-floors.sh scales the property tests' examples (`examples`) down; a
    factor that is no positive number is refused by name."""
    from tests.helpers import EXAMPLES_ENV, examples

    floors = (Path(__file__).resolve().parents[1] / "scripts" / "test-floors.sh").read_text()
    assert f'export {EXAMPLES_ENV}="${{{EXAMPLES_ENV}:-0.25}}"' in floors
    monkeypatch.setenv(EXAMPLES_ENV, "0.25")
    assert (examples(300), examples(2)) == (75, 1)
    monkeypatch.delenv(EXAMPLES_ENV)
    assert examples(300) == 300
    for bad in ("x", "0", "-1", "nan"):
        monkeypatch.setenv(EXAMPLES_ENV, bad)
        with pytest.raises(ValueError, match=EXAMPLES_ENV):
            examples(10)


def test_the_floors_leave_the_fuzz_to_the_main_run_while_torch_and_transformers_agree() -> None:
    """scripts/test-floors.sh leaves the engine fuzz out because the floors of torch and
    transformers are the lock's own versions: lowering either floor must bring it back."""
    import re

    def version(text: str) -> tuple[int, ...]:
        parts = [int(x) for x in text.split(".")]
        return tuple(parts + [0] * (3 - len(parts)))

    root = Path(__file__).resolve().parents[1]
    floors = (root / "scripts" / "test-floors.sh").read_text()
    assert "--ignore tests/engine/test_fuzz.py" in floors
    project = (root / "pyproject.toml").read_text()
    lock = (root / "scripts" / "ci-lock.txt").read_text()
    for name in ("torch", "transformers"):
        floor = re.search(rf'"{name}>=([\d.]+)', project)
        pinned = re.search(rf"^{name}==([\d.]+)", lock, re.M)
        assert floor and pinned, name
        assert version(floor.group(1)) == version(pinned.group(1)), (
            f"{name}'s floor {floor.group(1)} is below the lock's {pinned.group(1)}: run "
            "tests/engine/test_fuzz.py at the floors again (scripts/test-floors.sh)")


def test_the_mutation_groups_name_files_that_exist() -> None:
    """bench_mutation.py's groups name modules and tests by path: a rename that leaves
    one behind makes mutmut's first test run fail before any mutant is tried."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_mutation
    finally:
        sys.path.pop(0)
    for group in (bench_mutation.CORE, bench_mutation.ENGINE, bench_mutation.QUICK):
        for module in group.modules:
            assert (REPO / "src" / "marconi" / module).is_file(), (group.name, module)
        for test in group.tests:
            assert (REPO / test.split("::")[0]).is_file(), (group.name, test)
