"""The README's examples run as written: every bash and python block of the sections
about the library, the reference engine, traces, the CLI, sweeps and the Python API, in
order, in one scratch folder, and the lines the README says they print are printed. Not
run here: the first block (its two commands are CI itself: `scripts/test.sh`, and the
demo), and the Server block (a server that listens until stopped, with a model folder of
the reader's own: the server's tests start it and talk to it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTIONS = ("### Library", "### Reference engine", "### Simulator", "### Traces",
            "### Sweeps and the paper's figures", "### Python API")
# what the README says a block prints
SHOWN = {"### Library": ("turn 1: 0 of 2000 input tokens from the cache",
                         "turn 2: 2016 of 2019 input tokens from the cache"),
         "### Reference engine": ("0 265",),
         "### Traces": ("trace requests.jsonl (openai): kept 1 session, 2 requests, 83 input "
                        "tokens; read 2 requests; dropped none",)}
_FENCE = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)


def blocks() -> list[tuple[str, str, str]]:
    """(section, language, code) of every runnable block in SECTIONS, in README order."""
    text = README.read_text()
    out = []
    for part in re.split(r"(?m)^(?=### )", text):
        title = part.splitlines()[0] if part else ""
        if title in SECTIONS:
            out += [(title, m.group(1), m.group(2)) for m in _FENCE.finditer(part)]
    return out


def test_the_sections_have_examples() -> None:
    found = {section for section, _, _ in blocks()}
    assert found == set(SECTIONS)


@pytest.mark.slow
def test_readme_examples_run_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MARCONI_CACHE_DIR": str(tmp_path / "cache"), "MPLBACKEND": "Agg"}
    for section, language, code in blocks():
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" \
            else [sys.executable, "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, f"{section}:\n{code}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{section}:\n{code}\n{done.stderr[-3000:]}"
        for shown in SHOWN.get(section, ()):
            said = done.stdout + done.stderr
            assert shown in said, f"{section}: README shows {shown!r}:\n{said}"
