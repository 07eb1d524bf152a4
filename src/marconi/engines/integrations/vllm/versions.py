"""The vLLM versions the plugin supports and what differs between them: the check
(`check_version`), where a block keeps its hash and depth (`block_fields`) and what it
holds as its pool (`pool_self`); with the plugin's name in its refusals (`WHO`) and the
logger of its lines."""

from __future__ import annotations

import logging
from typing import Any

from marconi.engines.integrations.common import IntegrationError

# any 0.32.x, 0.33.x or 0.34.x: the series whose cache classes the tests run it through
# (0.33 and 0.34 from their GPU wheels, docs/integrations.md, "vLLM 0.33", "vLLM 0.34")
SUPPORTED_VERSIONS = ("0.32", "0.33", "0.34")
WHO = "marconi.engines.integrations.vllm"
# vLLM's own logger tree, so that the plugin's lines carry each process's prefix
log = logging.getLogger("vllm.marconi")


def block_fields(version: str) -> tuple[str, str]:
    """The names of `KVCacheBlock`'s hash and depth slots in vLLM `version`: up to 0.33
    the slots behind the properties `block_hash` / `block_hash_num_tokens` (read directly:
    a call less each, in the hooks' loops), from 0.34 plain fields of those names."""
    if _series(version) >= (0, 34):
        return "block_hash", "block_hash_num_tokens"
    return "_block_hash", "_block_hash_num_tokens"


def _series(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def pool_self(pool: Any) -> Any:
    """What a block of `pool` holds as its `pool`: the pool itself up to 0.33, a weak
    reference to it from 0.34 (`BlockPool._weak_self`, set in its `__init__`)."""
    return pool.__dict__.get("_weak_self", pool)


def check_version() -> str:
    """The installed vLLM's version (its own `__version__`: the GPU and CPU builds ship
    under different distribution names), or IntegrationError naming the supported one."""
    *first, last = (f"{v}.x" for v in SUPPORTED_VERSIONS)
    supported = f"{', '.join(first)} and {last}" if first else last
    try:
        import vllm
    except ImportError:
        raise IntegrationError(f"{WHO}: vllm is not installed (it supports vllm "
                               f"{supported})") from None
    version = str(vllm.__version__)
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VERSIONS):
        raise IntegrationError(f"{WHO} supports vllm {supported} only; this environment "
                               f"has {version}")
    return version
