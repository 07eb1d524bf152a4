"""The compiled core is optional: where no C++ compiler is found, marconi still builds
and installs (its Python core runs; `marconi.core.compiled` says so at run time)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("Cython", reason="the build test needs Cython (the dev extra)")


def test_without_a_compiler_the_package_builds_without_its_compiled_core(
        tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, tree / name if tree.exists() else _mkdir(tree) / name)
    shutil.copytree(REPO / "src", tree / "src",
                    ignore=shutil.ignore_patterns("*.so", "*.cpp", "__pycache__", "*.egg-info"))
    env = {**os.environ, "CC": "/bin/false", "CXX": "/bin/false"}
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp_path / "dist"), str(tree)],
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("marconi-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "marconi/core/compiled.py" in names
    assert not any("_native" in n and n.endswith(".so") for n in names), names


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
