"""Optional extras: say which one to install before any work starts."""

from __future__ import annotations

import importlib.util


def require(extra: str, *modules: str) -> None:
    """ValueError naming `extra` unless every module in `modules` can be imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"this needs the '{extra}' extra ({', '.join(missing)} not "
                         f"installed): pip install 'marconi[{extra}]'")
