"""Where each engine's environment lives, and the one-line error when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

from marconi.engine_flags import ENGINES, Engine

ENV_VAR = "MARCONI_PEERS_DIR"  # a folder holding one environment per engine
SETUP = "bash scripts/setup-peers.sh"  # what builds them (docs/peers.md)
SRC = Path(__file__).resolve().parents[3]  # the folder holding the marconi package


class PeerError(ValueError):
    """A real-engine replay that could not run or did not finish (never a partial
    result): the message names the engine, the request and the reason."""


def worker_command(python: Path, engine: Engine) -> tuple[list[str], dict[str, str]]:
    """The command line that runs `engine`'s worker under `python`, and its environment:
    `python -P -m marconi.engines.real.ENGINE_worker`, the folder holding this package first
    on `PYTHONPATH` (the engine's environment need not have marconi installed; `-P` keeps
    the working folder off the path). The worker's modules import each other as
    `marconi.engines.real.x`, and `import marconi` loads nothing else of marconi."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return [str(python), "-P", "-m", engine.worker], env


def envs_dir() -> Path:
    """`$MARCONI_PEERS_DIR`, else `.venv-peers` of the source tree this package runs from
    (what scripts/setup-peers.sh builds), else `~/.cache/marconi/peers`."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    tree = Path(__file__).resolve().parents[4]  # src/marconi/engines/real -> the checkout
    if (tree / "pyproject.toml").is_file():
        return tree / ".venv-peers"
    return Path.home() / ".cache" / "marconi" / "peers"


def python_of(engine: Engine) -> Path:
    """The engine environment's interpreter, or PeerError naming the setup command."""
    python = envs_dir() / engine.name / "bin" / "python"
    if not python.is_file():
        raise PeerError(f"{engine.system} needs {engine.kind or engine.name} "
                        f"{engine.version}'s own environment, not found at "
                        f"{python.parent.parent}: run `{SETUP}` "
                        f"(or point {ENV_VAR} at a folder holding it)")
    return python


def available(engine: str) -> bool:
    """Whether `engine`'s environment is built (tests and benchmarks skip without it)."""
    return (envs_dir() / ENGINES[engine].name / "bin" / "python").is_file()
