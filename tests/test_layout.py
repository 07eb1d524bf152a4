"""The layering of docs/architecture.md, asserted: a one-way core, policy families that never
import the registry, no import cycle, and a CLI that loads no heavy dependency."""

from __future__ import annotations

import ast
import importlib.util
import re
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


def _resolve(base: str, known: set[str]) -> str | None:
    """The marconi module an absolute dotted name means: itself or its longest known
    prefix (`marconi.x.y.Name` -> `marconi.x.y`)."""
    if not base.startswith("marconi"):
        return None
    parts = base.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def _imported_by_name(node: ast.Call) -> str | None:
    """The module named by `importlib.import_module("...")` (or `import_module(f"x.{y}")`:
    the constant head, `x`), else None."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
            and isinstance(arg.values[0].value, str)):
        return arg.values[0].value.rstrip(".") or None
    return None


def imports_of(path: Path, known: set[str], text: str | None = None) -> set[str]:
    """marconi modules `path` (or `text` in its place) imports anywhere (function bodies
    and TYPE_CHECKING too): relative imports resolved from the module's package, and
    modules named to `importlib.import_module`."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_resolve(a.name, known) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..x import y` in package a.b.c -> a.b.x
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            found = _resolve(base, known)
            if found is None:
                continue
            for alias in node.names:  # `from marconi.x import y`: y may be a module
                sub = f"{found}.{alias.name}"
                out.add(sub if sub in known else found)
        elif isinstance(node, ast.Call):
            named = _imported_by_name(node)
            found = None if named is None else _resolve(named, known)
            if found is not None:
                out.add(found)
    return out & known


ENGINE_PACKAGES = {"sglang", "vllm"}  # the engines' own, beside `integrations/sglang.py`


def bare_imports(path: Path, text: str | None = None) -> set[str]:
    """The modules of marconi that `path` imports by bare name (`from vllm_engine import
    x`, `importlib.import_module("sglang_load")`), which only a folder put on `sys.path`
    resolves and no import graph can see. A name that is also a package's (`concurrent`,
    `tokenizers`; the engines, which live in their own environments) is that package."""
    ours = {p.stem for p in (SRC / "marconi").rglob("*.py")} - {"__init__"}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and (named := _imported_by_name(node)):
            out.add(named.split(".")[0])
    packages = ENGINE_PACKAGES | set(sys.stdlib_module_names)
    return {name for name in out & ours
            if name not in packages and importlib.util.find_spec(name) is None}


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


def within(name: str, *packages: str) -> bool:
    """`name` is one of `packages` or a module inside one (`marconi.systems` covers the
    package `marconi.systems.*`; `marconi.plus` does not cover `marconi.plusx`)."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_policy_families_never_import_the_registry() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.split(".")[1:2] in (["core"], ["paper"], ["peers"], ["plus"]):
            registry = {d for d in deps if within(d, "marconi.systems")}
            assert not registry, f"{name} imports the registry: {sorted(registry)}"


# What each policy family may import besides itself (checked with import_graph(): paper and
# peers use only the core; plus builds on paper's admission and eviction and on
# peers/sparse_prefix.py's placement).
FAMILY_IMPORTS = {"marconi.paper": ("marconi.core",),
                  "marconi.peers": ("marconi.core",),
                  "marconi.plus": ("marconi.core", "marconi.paper", "marconi.peers")}


def family_breaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each policy module's imports outside its family and what FAMILY_IMPORTS allows it."""
    out: dict[str, set[str]] = {}
    for name, deps in graph.items():
        for family, allowed in FAMILY_IMPORTS.items():
            if within(name, family):
                bad = {d for d in deps if not within(d, family, *allowed)}
                if bad:
                    out[name] = bad
    return out


def test_family_rule_finds_planted_imports() -> None:
    graph = {"marconi.paper.eviction": {"marconi.core.tree", "marconi.peers.tlru"},
             "marconi.peers.seglen": {"marconi.core.scores", "marconi.paper.eviction"},
             "marconi.plus.density": {"marconi.paper.admission", "marconi.peers.tlru",
                                      "marconi.systems.registry"},
             "marconi.plus.shadows": {"marconi.core.cache", "marconi.paper.tuner",
                                      "marconi.plus.density"},
             "marconi.sim.oracle": {"marconi.paper.tuner"}}
    assert family_breaches(graph) == {"marconi.paper.eviction": {"marconi.peers.tlru"},
                                      "marconi.peers.seglen": {"marconi.paper.eviction"},
                                      "marconi.plus.density": {"marconi.systems.registry"}}
    stats = SRC / "marconi" / "paper" / "tuner.py"
    planted = imports_of(stats, set(_modules()), "def f():\n    from ..plus import shadows\n")
    assert family_breaches({"marconi.paper.tuner": planted}) == {
        "marconi.paper.tuner": {"marconi.plus.shadows"}}


def test_policy_families_import_only_what_their_layer_allows() -> None:
    """paper/ and peers/ import only core/; plus/ only core/, paper/ and peers/."""
    assert family_breaches(import_graph()) == {}


# The layers above the engines (docs/architecture.md, "Layers"): the drivers and faces, the
# CLI and its commands, the library's API. Inside engines/, real/ (the engines' environments
# and workers) reaches nothing above it, the registry included; integrations/ builds systems
# from the registry (`get_system`, `TunerOptions`) and may drive real/'s loader; hf/
# (marconi's own engine) runs systems and knows neither of the others.
ABOVE_ENGINES = ("marconi.sim", "marconi.commands", "marconi.cli", "marconi.server",
                 "marconi.report", "marconi.reproduction", "marconi.api")
REAL, PLUGINS, HF = "marconi.engines.real", "marconi.engines.integrations", "marconi.engines.hf"
ABOVE = {REAL: (*ABOVE_ENGINES, "marconi.systems", PLUGINS, HF),
         PLUGINS: (*ABOVE_ENGINES, HF),
         HF: (*ABOVE_ENGINES, REAL, PLUGINS)}


def reach(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every module that importing `name` imports, directly or through others, each with
    the packages above it (whose `__init__` runs first)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            parts = dep.split(".")
            for new in (".".join(parts[:i]) for i in range(2, len(parts) + 1)):
                if new not in seen and new in graph:
                    seen.add(new)
                    todo.append(new)
    return seen


def layer_breaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module of engines/ and the modules of a layer above it that it reaches."""
    out: dict[str, set[str]] = {}
    for name in graph:
        for package, above in ABOVE.items():
            if within(name, package):
                bad = {d for d in reach(graph, name) if within(d, *above)}
                if bad:
                    out[name] = bad
    return out


def test_layer_rule_finds_planted_imports() -> None:
    known = set(_modules())
    worker = SRC / "marconi" / "engines" / "real" / "worker.py"
    planted = imports_of(worker, known, "def f():\n    from ...sim.result import SimResult\n"
                         "    from marconi.commands import sweep\n")
    assert planted == {"marconi.sim.result", "marconi.commands.sweep"}
    graph = {"marconi.engines.real.worker": planted, "marconi.sim.result": set(),
             "marconi.commands.sweep": set(), "marconi.sim": set(), "marconi.commands": set()}
    assert layer_breaches(graph) == {"marconi.engines.real.worker": {
        "marconi.sim", "marconi.sim.result", "marconi.commands", "marconi.commands.sweep"}}
    # through a lower module, through a package's __init__, the registry
    graph = {"marconi.engines.real.envs": {"marconi.workload.types"},
             "marconi.workload.types": {"marconi.core.tokens"}, "marconi.core.tokens": set(),
             "marconi.workload": {"marconi.sim.summary"}, "marconi.sim.summary": set(),
             "marconi.engines.real.worker": {"marconi.systems"}, "marconi.systems": set(),
             "marconi.engines.integrations.common": {"marconi.systems", "marconi.server.app"},
             "marconi.server.app": set()}
    assert layer_breaches(graph) == {
        "marconi.engines.real.envs": {"marconi.sim.summary"},  # through workload's __init__
        "marconi.engines.real.worker": {"marconi.systems"},
        "marconi.engines.integrations.common": {"marconi.server.app"}}


def test_engines_import_no_layer_above() -> None:
    """No module of engines/ reaches the drivers, the CLI, its commands or the API; real/
    reaches neither the registry nor the rest of engines/, and hf/ neither real/ nor
    integrations/."""
    assert layer_breaches(import_graph()) == {}


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


def test_an_engine_worker_loads_only_its_own_folder_of_marconi() -> None:
    """The workers run in the engines' environments as `marconi.engines.real.x`: importing
    them loads `marconi` and `marconi.engines` (which load nothing eagerly), the engines'
    flags (`marconi.engine_flags`, standard library only) and engines/real/ alone."""
    workers = sorted(p.stem for p in (SRC / "marconi" / "engines" / "real").glob("*_worker.py"))
    assert len(workers) == 3
    code = "\n".join(f"import marconi.engines.real.{w}" for w in workers)
    ours = {m for m in _loaded_after(code) if m.startswith("marconi")}
    assert {f"marconi.engines.real.{w}" for w in workers} <= ours
    alone = {"marconi", "marconi.engines", "marconi.engine_flags", REAL}
    assert all(m in alone or m.startswith(REAL + ".") for m in ours), sorted(ours)


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
    assert policy_reach_breaches(import_graph()) == {}


FAMILIES = ("marconi.paper", "marconi.peers", "marconi.plus")
# who may import which policy modules; a key covers its package's modules (marconi.systems.*)
REACH_POLICIES = {"marconi.systems": FAMILIES, "marconi.sim.oracle": ("marconi.paper.tuner",),
                  "marconi.engines.integrations.choosers": ("marconi.plus.shadows",)}


def policy_reach_breaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module outside the families and the policy modules it imports without leave."""
    out: dict[str, set[str]] = {}
    for name, deps in graph.items():
        if within(name, *FAMILIES):
            continue
        allowed = [p for key, ps in REACH_POLICIES.items() if within(name, key) for p in ps]
        bad = {d for d in deps if within(d, *FAMILIES) and not within(d, *allowed)}
        if bad:
            out[name] = bad
    return out


def test_policy_reach_finds_planted_imports() -> None:
    graph = {"marconi.systems.baselines": {"marconi.peers.tlru", "marconi.paper.eviction"},
             "marconi.systems": {"marconi.systems.registry"},
             "marconi.sim.oracle": {"marconi.paper.tuner", "marconi.paper.eviction"},
             "marconi.sim.replay": {"marconi.plus.shadows"},
             "marconi.engines.integrations.choosers": {"marconi.plus.shadows"},
             "marconi.plus.switchable": {"marconi.paper.eviction"}}
    assert policy_reach_breaches(graph) == {"marconi.sim.oracle": {"marconi.paper.eviction"},
                                            "marconi.sim.replay": {"marconi.plus.shadows"}}


# --- the house drawing: folders and their layers ---------------------------------------

DOCS = SRC.parent / "docs" / "architecture.md"


def folder_of(module: str) -> str:
    """The top-level folder or module of marconi that `module` lies in (`marconi.sim.run`
    -> `sim`, `marconi.cli` -> `cli`, the package's own `__init__` -> `__init__`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def folder_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Each folder, the folders it imports, and for each the module arrows behind it."""
    out: dict[str, dict[str, set[str]]] = {folder_of(m): {} for m in graph}
    for module, deps in graph.items():
        for dep in deps:
            a, b = folder_of(module), folder_of(dep)
            if a != b:
                out[a].setdefault(b, set()).add(f"{module} -> {dep}")
    return out


def drawn_layers(text: str) -> list[list[str]]:
    """The "Layers" drawing of `text` (docs/architecture.md), top line first: each line's
    folders and modules (`core/` -> `core`, `settings.py` -> `settings`)."""
    block = text.split("\n## Layers\n", 1)[1].split("```", 2)[1]
    layers = []
    for line in block.splitlines():
        names = []
        for word in line.split():
            match = re.fullmatch(r"([a-z_]+)(?:/|\.py),?", word)
            if match is None:  # the line's description
                break
            names.append(match.group(1))
        if names:
            layers.append(names)
    return layers


def upward_arrows(folders: dict[str, dict[str, set[str]]],
                  layers: list[list[str]]) -> dict[str, set[str]]:
    """Each folder arrow that points to a higher line of the drawing, with its module
    arrows (an arrow within a line points sideways; `folder_cycles` keeps those one-way)."""
    line = {name: i for i, names in enumerate(layers) for name in names}
    undrawn = sorted(set(folders) - set(line))
    assert not undrawn, f"not in docs/architecture.md's Layers drawing: {undrawn}"
    return {f"{a} -> {b}": arrows for a, deps in folders.items()
            for b, arrows in deps.items() if line[b] < line[a]}


def folder_cycles(folders: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    return cycles({a: set(deps) for a, deps in folders.items()})


def test_drawing_is_read() -> None:
    layers = drawn_layers(DOCS.read_text())
    assert layers[0][:3] == ["commands", "cli", "api"]
    assert layers[-1] == ["core", "settings", "engine_flags"]
    assert sum(len(names) for names in layers) == len({n for ns in layers for n in ns})


def test_folder_rules_find_planted_arrows() -> None:
    known = set(_modules())
    common = SRC / "marconi" / "engines" / "integrations" / "common.py"
    planted = imports_of(common, known, "def f():\n    import importlib\n"
                         "    importlib.import_module('marconi.sim.run')\n")
    assert planted == {"marconi.sim.run"}
    engine = SRC / "marconi" / "engines" / "real" / "vllm_replay.py"
    planted = ("def f():\n    from vllm_engine import Engine\n    import worker_io, json\n"
               "    importlib.import_module('sglang_load')\n")
    assert bare_imports(engine, planted) == {"vllm_engine", "worker_io", "sglang_load"}
    assert imports_of(engine, known, planted) == set()  # what the graph cannot see
    # the loop before engines/ was one folder: the registry read the workers' flags
    graph = {"marconi.systems.engines": {"marconi.engines.real.envs", "marconi.core.spec"},
             "marconi.engines.real.envs": set(), "marconi.core.spec": set(),
             "marconi.engines.integrations.common": {"marconi.systems"},
             "marconi.systems": set()}
    folders = folder_graph(graph)
    assert folder_cycles(folders) == [["engines", "systems"]]
    layers = [["engines"], ["systems"], ["core"]]
    assert upward_arrows(folders, layers) == {
        "systems -> engines": {"marconi.systems.engines -> marconi.engines.real.envs"}}
    with pytest.raises(AssertionError, match=r"drawing: \['core'\]"):
        upward_arrows(folders, layers[:-1])


def test_modules_import_their_neighbours_as_modules() -> None:
    """No module imports another of marconi's by bare name (the engines' workers included:
    they run as `python -m marconi.engines.real.x`), so the import graph sees every arrow."""
    found = {name: bare for name, path in _modules().items() if (bare := bare_imports(path))}
    assert found == {}


def test_no_folder_cycle() -> None:
    """The top-level folders of marconi import each other in no loop (counting imports
    inside functions and modules named to `importlib`)."""
    assert folder_cycles(folder_graph(import_graph())) == []


def test_folder_arrows_point_down_the_drawing() -> None:
    """Every folder imports only folders on its line of docs/architecture.md's "Layers"
    drawing or below it."""
    layers = drawn_layers(DOCS.read_text())
    assert upward_arrows(folder_graph(import_graph()), layers) == {}


# --- small rooms: what one reader holds at once (docs/architecture.md, "Layers") ------------
MODULE_LINES, FUNCTION_LINES = 600, 80


def oversized(text: str, name: str) -> list[str]:
    """What breaks the rooms' rules in the source `text` of module `name`: over
    `MODULE_LINES` lines, a function over `FUNCTION_LINES` (decorators aside, its docstring
    counted), a class defined inside a function."""
    out = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES:
        out.append(f"{name}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > FUNCTION_LINES:
            out.append(f"{name}.{node.name}: {length} lines")
        out += [f"{name}.{node.name}: defines class {inner.name}"
                for inner in ast.walk(node) if isinstance(inner, ast.ClassDef)]
    return out


def test_room_rule_finds_planted_breaches() -> None:
    long_body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert oversized(f"def f():\n{long_body}\n", "m") == [f"m.f: {FUNCTION_LINES + 1} lines"]
    assert oversized("def f():\n    class Pool:\n        pass\n", "m") == \
        ["m.f: defines class Pool"]
    assert oversized("x = 1\n" * (MODULE_LINES + 1), "m") == [f"m: {MODULE_LINES + 1} lines"]
    assert oversized("def f():\n    return 1\n", "m") == []


def test_every_module_is_a_small_room() -> None:
    """No Python module of marconi over 600 lines, no function over 80, no class defined
    inside a function (the compiled core's C++ is not held to it)."""
    found = [x for name, path in _modules().items()
             for x in oversized(path.read_text(), name)]
    assert found == []


def _eviction_reads(source: str) -> list[str]:
    """What the compiled cache's builder reads of the eviction it was given: each
    attribute read on a name `eviction` or `policy`, and each comparison of
    `compiled_as(eviction)` with a name (a branch on the policy)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in ("eviction", "policy"):
            found.append(f"{node.value.id}.{node.attr}")
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                and getattr(node.left.func, "id", None) == "compiled_as" \
                and any(getattr(a, "id", None) == "eviction" for a in node.left.args):
            found.append(f"compiled_as(eviction) compared (line {node.lineno})")
    return found


def test_the_compiled_core_reads_no_policys_attributes() -> None:
    """`CompiledCache` asks an eviction for its declaration and books
    (`Eviction.core_books`) and reads nothing else of it but its alpha; `_Eviction`, the
    driver's view of the policy it runs, passes calls through."""
    tree = ast.parse((SRC / "marconi/core/compiled.py").read_text())
    cache = next(n for n in tree.body
                 if isinstance(n, ast.ClassDef) and n.name == "CompiledCache")
    assert set(_eviction_reads(ast.unparse(cache))) <= {"eviction.alpha", "eviction.core_books"}
    planted = ("def f(eviction):\n    if compiled_as(eviction) == 'gd':\n"
               "        x = eviction.level\n")
    assert sorted(_eviction_reads(planted)) == ["compiled_as(eviction) compared (line 2)",
                                                "eviction.level"]
