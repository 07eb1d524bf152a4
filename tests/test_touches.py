"""What the plugins cost (marconi.engines.integrations.touches, docs/integrations.md "What the
patches cost"): every engine name the plugins touch that is not an extension point is
listed per supported version, each supported version installed still has each one (a
version that drops one fails here, naming it, the plugin and how it is used), the docs
show the list, and the plugins touch no private name the list lacks.

The engines' environments come from `bash scripts/setup-peers.sh`; without one its case
skips, except under CI, where it fails (tests/test_realpeers.py `need`)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marconi.engine_flags import ENGINES
from marconi.engines.integrations import touches
from marconi.engines.integrations.touches import OWN, TOUCHED, Touch, markdown, missing
from marconi.engines.real.envs import envs_dir
from tests.test_realpeers import need

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "src" / "marconi" / "engines" / "integrations" / "touches.py"
# each engine environment (engine_flags.ENGINES): the engine it holds
ENVIRONMENTS = {key: engine.kind or engine.name for key, engine in ENGINES.items()}


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_every_supported_version_still_has_every_name_the_plugins_touch(
        environment: str) -> None:
    need(environment)
    engine = ENVIRONMENTS[environment]
    python = envs_dir() / environment / "bin" / "python"
    done = subprocess.run([str(python), str(SCRIPT), engine], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["version"] == ENGINES[environment].version
    assert not found["missing"], "\n".join(found["missing"])


def test_a_name_gone_is_reported_with_the_plugin_and_how(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The check itself, on a module of this test's own: a class attribute, a method and
    an attribute set in `__init__` are found; a name gone is one line naming it, the
    plugin and how it is used; a name listed for another version only is not asked of
    this one; an unsupported version is said so."""
    (tmp_path / "touches_probe.py").write_text(
        "class Pool:\n"
        "    kind = 'gpu'\n"
        "    def __init__(self):\n"
        "        self.blocks: list[\n"
        "            int] = []\n"
        "    def take(self):\n"
        "        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    listed = (Touch("vllm", "touches_probe", "Pool.kind", "read"),
              Touch("vllm", "touches_probe", "Pool.take", "overridden"),
              Touch("vllm", "touches_probe", "Pool.blocks", "read", instance=True),
              Touch("vllm", "touches_probe", "Pool.gone", "overridden"),
              Touch("vllm", "touches_probe", "Pool.old", "read", ("0.32",)),
              Touch("vllm", "touches_probe", "Pool.unset", "read", instance=True))
    lines = missing("vllm", "0.34.0", listed)
    assert lines == [
        'vllm 0.34.0 has no touches_probe.Pool.gone, which marconi.engines.integrations.vllm '
        'needs (overridden; docs/integrations.md, "What the patches cost")',
        'vllm 0.34.0 has no touches_probe.Pool.unset, which marconi.engines.integrations.vllm '
        'needs (read; docs/integrations.md, "What the patches cost")']
    assert len(missing("vllm", "0.32.1", listed)) == 3  # `old` asked of 0.32 too
    assert missing("vllm", "0.35.0", listed) == [
        "vllm 0.35.0 is not a version marconi.engines.integrations.vllm supports "
        "(0.32, 0.33, 0.34)"]


def test_the_versions_are_the_plugins_own() -> None:
    from marconi.engines.integrations import sglang, vllm

    assert touches.VERSIONS["vllm"] == vllm.SUPPORTED_VERSIONS
    assert touches.VERSIONS["sglang"] == (sglang.SUPPORTED_VERSION,)
    for version in vllm.SUPPORTED_VERSIONS:  # the block fields the plugin reads are listed
        for name in vllm.block_fields(version):
            assert any(t.path == f"KVCacheBlock.{name}" and t.has(version) for t in TOUCHED)


def test_the_docs_show_the_list() -> None:
    docs = (ROOT / "docs" / "integrations.md").read_text()
    assert markdown() in docs, "docs/integrations.md: run python " \
        "src/marconi/engines/integrations/touches.py --markdown and paste its table"
    done = subprocess.run([sys.executable, str(SCRIPT), "--markdown"], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == markdown()


@pytest.mark.parametrize("plugin", ["vllm", "sglang"])
def test_the_plugins_touch_no_private_name_the_list_lacks(plugin: str) -> None:
    """Every underscore name in a plugin's source (every module of a plugin that is a
    package; an attribute read, written or overridden, or a name given as a string) is
    the engine's and listed, or marconi's own (`OWN`)."""
    where = ROOT / "src" / "marconi" / "engines" / "integrations"
    files = [where / f"{plugin}.py"] if (where / f"{plugin}.py").is_file() \
        else sorted((where / plugin).glob("*.py"))
    trees = [ast.parse(path.read_text()) for path in files]
    names = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"_[a-z]\w*", node.value):
            names.add(node.value)
    defined = {n.name for tree in trees for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.col_offset == 0}
    private = {n for n in names if n.startswith("_") and not n.startswith("__")} - defined
    listed = {t.path.rsplit(".", 1)[-1] for t in TOUCHED if t.engine == plugin}
    unknown = sorted(private - listed - OWN)
    assert not unknown, (f"marconi.engines.integrations.{plugin} touches {unknown}: list each in "
                         "marconi.engines.integrations.touches.TOUCHED (an engine's) or OWN (ours)")
