"""What the plugins cost: every engine name `marconi.engines.integrations.vllm` and
`marconi.engines.integrations.sglang` touch that is not a supported extension point (docs/
integrations.md, "What the patches cost"), per supported version, and a check that an
installed engine still has each one.

vLLM's GPU `BlockPool` has no hook for an outside eviction order, and SGLang's eviction
strategies (`--radix-eviction-policy`) order only its KV leaves, never its Mamba states
(docs/integrations.md, "Why the Mamba walk is a hook"), so the plugins override or wrap
their methods and read their internals; any of these names may change in a release
without notice. `TOUCHED` lists them; `missing` says
which ones an installed engine lacks, each with the plugin that needs it and how. Run in
an engine's own environment (standard library only, so it runs anywhere):

    python src/marconi/engines/integrations/touches.py vllm      # JSON: version, missing (lines)
    python src/marconi/engines/integrations/touches.py --markdown  # the table of the docs

A name is found when the module's attribute path resolves (`getattr`, class attributes,
properties and dataclass fields with defaults), or, for an attribute set per instance
(`instance`), when the class's own source assigns `self.NAME` (its `__init__` or any
method).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass

# the versions each plugin supports (integrations.vllm / .sglang SUPPORTED_VERSION(S))
VERSIONS = {"vllm": ("0.32", "0.33", "0.34"), "sglang": ("0.5.23",)}
PLUGIN = {"vllm": "marconi.engines.integrations.vllm",
          "sglang": "marconi.engines.integrations.sglang"}


@dataclass(frozen=True, slots=True)
class Touch:
    engine: str  # "vllm" or "sglang"
    module: str  # where the name lives
    path: str  # the attribute path from the module: "Class.method", "Class.attr"
    how: str  # replaced, overridden, wrapped (patches), written, called, read
    versions: tuple[str, ...] = ()  # the supported versions that have it (empty: all)
    instance: bool = False  # set per instance (`self.NAME = ...`), not on the class

    @property
    def name(self) -> str:
        return f"{self.module}.{self.path}"

    def has(self, version: str) -> bool:
        return version in (self.versions or VERSIONS[self.engine])


_BP, _KU = "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils"
_URC = "sglang.srt.mem_cache.unified_radix_cache"
_UC = "sglang.srt.mem_cache.unified_cache"
_TC = f"{_UC}.unified_tree_core"

TOUCHED: tuple[Touch, ...] = (
    # --- vLLM: the patches
    Touch("vllm", "vllm.v1.core.kv_cache_coordinator", "BlockPool", "replaced"),
    Touch("vllm", "vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.__init__",
          "wrapped"),
    Touch("vllm", "vllm.v1.core.kv_cache_manager", "KVCacheManager.free", "wrapped"),
    *(Touch("vllm", _BP, f"BlockPool.{m}", "overridden") for m in (
        "cache_full_blocks", "cache_partial_block", "move_block_hashes",
        "_remove_cached_block_hashes", "_insert_block_hash", "reset_prefix_cache", "touch",
        "get_new_blocks")),
    Touch("vllm", "vllm.model_executor.layers.mamba.mamba_mixer2",
          "MambaMixer2.get_kv_cache_spec", "replaced"),  # MARCONI_VLLM_CPU_SPLIT=1 only
    # --- vLLM: what the hooks read
    Touch("vllm", _BP, "BlockPool.free_block_queue", "read", instance=True),
    Touch("vllm", _BP, "BlockPool.cached_block_hash_to_block", "read", instance=True),
    Touch("vllm", _BP, "BlockPool.cached_block_hashes_by_block", "read", instance=True),
    Touch("vllm", _BP, "BlockPool.blocks", "read", instance=True),
    Touch("vllm", _BP, "BlockPool.hash_block_size", "read", instance=True),
    Touch("vllm", _BP, "BlockPool.enable_caching", "read", instance=True),
    Touch("vllm", _BP, "BlockPool._weak_self", "read", ("0.34",), instance=True),
    Touch("vllm", _BP, "BlockHashToBlockMap._cache", "read", instance=True),
    Touch("vllm", _BP, "BlockHashToBlockMap.get_one_block", "called"),
    Touch("vllm", _KU, "FreeKVCacheBlockQueue.fake_free_list_head", "read", instance=True),
    Touch("vllm", _KU, "FreeKVCacheBlockQueue.remove", "called"),
    Touch("vllm", _KU, "FreeKVCacheBlockQueue.prepend_n", "called"),
    Touch("vllm", _KU, "FreeKVCacheBlockQueue.get_all_free_blocks", "called"),
    Touch("vllm", _KU, "KVCacheBlock.next_free_block", "read"),
    Touch("vllm", _KU, "KVCacheBlock._block_hash", "read", ("0.32", "0.33")),
    Touch("vllm", _KU, "KVCacheBlock._block_hash_num_tokens", "read", ("0.32", "0.33")),
    Touch("vllm", _KU, "KVCacheBlock.block_hash", "read"),
    Touch("vllm", _KU, "KVCacheBlock.block_hash_num_tokens", "read"),
    Touch("vllm", _KU, "KVCacheBlock.pool", "read"),
    Touch("vllm", _KU, "resolve_block_hashes", "called"),
    Touch("vllm", _KU, "make_block_hash_with_group_id", "called"),
    Touch("vllm", "vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.block_pool",
          "read", instance=True),
    Touch("vllm", "vllm.v1.core.kv_cache_coordinator",
          "KVCacheCoordinator.single_type_managers", "read", instance=True),
    Touch("vllm", "vllm.v1.core.single_type_kv_cache_manager",
          "SingleTypeKVCacheManager.req_to_blocks", "read", instance=True),
    Touch("vllm", "vllm.v1.request", "Request._all_token_ids", "read", instance=True),
    # --- SGLang: the patches
    Touch("sglang", _URC, "COMPONENT_REGISTRY", "replaced"),  # its MAMBA entry
    Touch("sglang", _URC, "UnifiedRadixCache.on_release", "wrapped"),
    *(Touch("sglang", f"{_UC}.components", f"MambaComponent.{m}", "overridden") for m in (
        "_evict_device_start", "_evict_device_next_node", "_evict_device_end")),
    Touch("sglang", f"{_UC}.components", "MambaComponent._evict_device_cursor", "written",
          instance=True),
    # --- SGLang: what the walk reads and calls
    Touch("sglang", f"{_UC}.components", "MambaComponent.tree_core", "read", instance=True),
    Touch("sglang", f"{_UC}.components", "MambaComponent.component_type", "read"),
    Touch("sglang", _TC, "UnifiedTreeCore.lru_lists", "read", instance=True),
    Touch("sglang", _TC, "UnifiedTreeCore.enable_hicache", "read", instance=True),
    Touch("sglang", _TC, "UnifiedTreeCore.enable_session_radix_cache", "read",
          instance=True),
    Touch("sglang", _TC, "UnifiedLRUList.in_list", "called"),
    Touch("sglang", _TC, "UnifiedLRUList.get_lru_no_lock", "called"),
    Touch("sglang", _TC, "UnifiedLRUList.get_prev_no_lock", "called"),
    Touch("sglang", _TC, "UnifiedTreeNode.component_data", "read", instance=True),
    Touch("sglang", f"{_UC}.components.base", "ComponentData.lock_ref", "read"),
    # --- SGLang: a declared priority as its eviction strategy (`install_priority`); the
    # strategies' registry has no public way in, its choices list has
    Touch("sglang", "sglang.srt.mem_cache.utils", "_EVICTION_POLICY_FACTORIES", "written"),
    Touch("sglang", "sglang.srt.arg_groups.choices", "add_radix_eviction_policy_choices",
          "called"),
    Touch("sglang", "sglang.srt.arg_groups.choices", "RADIX_EVICTION_POLICY_CHOICES",
          "read"),
    Touch("sglang", _TC, "UnifiedTreeNode.last_access_time", "read", instance=True),
    Touch("sglang", _TC, "UnifiedTreeNode.hit_count", "read", instance=True),
    Touch("sglang", _TC, "UnifiedTreeNode.creation_time", "read", instance=True),
)

# marconi's own underscore names in the plugins (its helpers, its books): not the
# engines', so not in `TOUCHED` (tests/test_integrations.py checks the plugins' source
# against both lists)
OWN = frozenset({
    "_check", "_installed", "_record", "_top", "_keys", "_cached", "_is_cached",
    "_marconi_choice", "_free_states", "_state_slots", "_victim", "_efficiency", "_f",
    "_kv", "_ssm", "_depths", "_depth", "_token_bytes", "_state_bytes", "_marconi_walk",
    "_marconi_quota", "_books", "_clock", "_recency", "_mamba", "_counters", "_features",
    "_feature", "_before", "_lowest", "_queue_last",
})


def _resolve(module: object, path: str) -> tuple[object | None, str]:
    """The object holding the last name of `path`, and that name (None: a step failed)."""
    *steps, last = path.split(".")
    obj = module
    for step in steps:
        obj = getattr(obj, step, None)
        if obj is None:
            return None, last
    return obj, last


def _assigned(cls: type, name: str) -> bool:
    """Whether the class's own source (or a base's) assigns `self.name`."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=]*)?=(?!=)")
    for klass in inspect.getmro(cls):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def missing(engine: str, version: str, touched: tuple[Touch, ...] = TOUCHED) -> list[str]:
    """One line per name of `touched` that this installed `engine` (at `version`)
    lacks, saying which plugin needs it and how; empty when all are there."""
    series = next((v for v in VERSIONS[engine]
                   if version == v or version.startswith(v + ".")), None)
    if series is None:
        return [f"{engine} {version} is not a version {PLUGIN[engine]} supports "
                f"({', '.join(VERSIONS[engine])})"]
    out = []
    for touch in touched:
        if touch.engine != engine or not touch.has(series):
            continue
        try:
            module = importlib.import_module(touch.module)
        except Exception as exc:  # a module gone or broken: every name in it is missing
            out.append(f"{engine} {version}: cannot import {touch.module} ({exc}), where "
                       f"{PLUGIN[engine]} needs {touch.path} ({touch.how})")
            continue
        holder, last = _resolve(module, touch.path)
        found = holder is not None and (
            hasattr(holder, last)
            or (touch.instance and isinstance(holder, type) and _assigned(holder, last)))
        if not found:
            out.append(f"{engine} {version} has no {touch.name}, which {PLUGIN[engine]} "
                       f"needs ({touch.how}; docs/integrations.md, \"What the patches "
                       f"cost\")")
    return out


def markdown() -> str:
    """The table of docs/integrations.md: one row per name, a column per version."""
    columns = [(e, v) for e in ("vllm", "sglang") for v in VERSIONS[e]]
    head = ["engine", "name", "how", *(f"{'vLLM' if e == 'vllm' else 'SGLang'} {v}"
                                       for e, v in columns)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for t in TOUCHED:
        cells = ["yes" if t.engine == e and t.has(v) else ("-" if t.engine == e else "")
                 for e, v in columns]
        rows.append("| " + " | ".join([t.engine, f"`{t.module}.{t.path}`", t.how, *cells])
                    + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        print(markdown())
        return 0
    if len(argv) != 1 or argv[0] not in VERSIONS:
        print(f"usage: touches.py ENGINE (one of {', '.join(VERSIONS)}) | --markdown",
              file=sys.stderr)
        return 2
    engine = argv[0]
    if engine == "sglang":  # loaded as the replay loads it: GPU-only imports stubbed
        src = os.path.abspath(__file__)
        for _ in range(4):  # src/marconi/engines/integrations/touches.py -> src
            src = os.path.dirname(src)
        sys.path.insert(0, src)  # the folder holding marconi, which loads nothing eagerly
        sglang_load = importlib.import_module("marconi.engines.real.sglang_load")
        sglang_load.install_stubs()
        sglang_load._skip_frontend_init()
        version = importlib.metadata.version("sglang")
    else:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the GPU wheels, on the CPU
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        version = str(importlib.import_module(engine).__version__)
    print(json.dumps({"engine": engine, "version": version,
                      "missing": missing(engine, version)}))
    return 0


if __name__ == "__main__":
    # run as a script, this folder is first on the path, and its vllm/ and sglang.py
    # (the plugins) would shadow the engines
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main(sys.argv[1:]))
