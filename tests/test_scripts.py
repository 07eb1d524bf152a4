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
