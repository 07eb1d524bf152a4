"""Paper reproduction: experiment configs (one TOML per figure) -> sweep -> PNG + table."""

from __future__ import annotations

from marconi.reproduction.config import Experiment, load_experiments

__all__ = ["Experiment", "load_experiments"]
