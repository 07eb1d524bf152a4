"""The layering of docs/architecture.md, asserted: a one-way core, policy families that never
import the registry, no import cycle, and a CLI that loads no heavy dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "dask", "distributed", "matplotlib")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "marconi").rglob("*.py"))}


def imports_of(path: Path, known: set[str], text: str | None = None) -> set[str]:
    """marconi modules `path` (or `text` in its place) imports anywhere (function bodies
    and TYPE_CHECKING too), relative imports resolved from the module's package."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("marconi"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..x import y` in package a.b.c -> a.b.x
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            if not base.startswith("marconi"):
                continue
            for alias in node.names:  # `from marconi.x import y`: y may be a module
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return out & known


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports_of(path, known) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_count() -> None:
    """A cycle hidden behind relative imports inside functions is still a cycle."""
    known = {"marconi.core", "marconi.core.stats", "marconi.core.tree", "marconi.sim",
             "marconi.sim.replay"}
    text = ("def f():\n    from ..sim import replay\n    from . import tree\n"
            "    from .tree import Node\n")
    stats = SRC / "marconi" / "core" / "stats.py"
    assert imports_of(stats, known, text) == {"marconi.sim.replay", "marconi.core.tree"}
    init = SRC / "marconi" / "core" / "__init__.py"
    assert imports_of(init, known, "from .tree import Node\n") == {"marconi.core.tree"}


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_core_imports_only_core() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("marconi.core"):
            outside = {d for d in deps if not d.startswith("marconi.core")}
            assert not outside, f"{name} imports {sorted(outside)}"


def test_policy_families_never_import_the_registry() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.split(".")[1:2] in (["core"], ["paper"], ["peers"], ["plus"]):
            assert "marconi.systems" not in deps, f"{name} imports the registry"


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print('\\n'.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_import_core_loads_nothing_else_of_marconi() -> None:
    loaded = _loaded_after("import marconi.core")
    ours = {m for m in loaded if m.startswith("marconi")}
    assert ours and all(m == "marconi" or m.startswith("marconi.core") for m in ours), (
        sorted(m for m in ours if not m.startswith("marconi.core")))


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"],
                                  ["simulate", "synthetic:twice:sessions=3", "--system",
                                   "sglang+", "--json", "--quiet"]])
def test_cli_loads_no_heavy_dependency(argv: list[str]) -> None:
    code = ("import contextlib, io, sys\nfrom marconi.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass")
    loaded = _loaded_after(code)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"marconi {' '.join(argv)} imported {heavy[:5]}"


def test_drivers_reach_policies_only_through_the_registry() -> None:
    """The simulator, engine, server and commands name systems; only the registry, the
    oracle (which searches the paper's alpha grid) and the integrations' choosers
    (which run marconi+'s switching rule beside an engine) import a policy family."""
    families = ("marconi.paper", "marconi.peers", "marconi.plus")
    allowed = {"marconi.systems": families, "marconi.sim.oracle": ("marconi.paper.tuner",),
               "marconi.integrations.choosers": ("marconi.plus.shadows",)}
    for name, deps in import_graph().items():
        if name.startswith(families):
            continue
        reached = {d for d in deps if d.startswith(families)}
        assert all(d.startswith(allowed.get(name, ())) for d in reached), (name, reached)
