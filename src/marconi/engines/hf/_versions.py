"""The oldest library versions the engine is right with, checked when it is imported.

Before transformers 5.14, continuing a hybrid model's generation from a cached state is
silently wrong (the cache's SSM and conv states are not carried into the next forward):
tokens would differ from an uncached run with no error. From 5.14 to 5.23 the
linear-attention cache layers initialize differently and a restored state fails at the
first cached request; 5.24 is the oldest the engine's tests pass with
(scripts/test-floors.sh). So importing the engine (its `__init__` imports this module
first) raises `UnsupportedVersion` below it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.version import Version

MINIMUM = {"transformers": "5.24"}
WHY = {"transformers": "earlier versions fail to restore a cached state, or before 5.14 are "
                       "silently wrong for hybrid-cache continuation"}


class UnsupportedVersion(ImportError, ValueError):
    """An installed library older than `MINIMUM` says (a ValueError too: the CLI prints
    it as `marconi: error: ...`)."""


def check(installed: dict[str, str] | None = None) -> None:
    """UnsupportedVersion naming the library, its version and the minimum, if any
    installed library (or any of `installed`, name -> version) is too old."""
    for name, minimum in MINIMUM.items():
        found = (installed or {}).get(name) or _installed(name)
        if found is not None and Version(found) < Version(minimum):
            raise UnsupportedVersion(
                f"the engine needs {name} >= {minimum} ({WHY[name]}); {found} is installed: "
                f"pip install '{name}>={minimum}'")


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


check()
