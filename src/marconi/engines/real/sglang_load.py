"""SGLang 0.5.23 loaded where there is no GPU, its version checked first: the GPU-only
modules SGLang imports at load time are stubbed (`install_stubs`), `sglang/__init__.py`
(the frontend language) is skipped, and the classes and functions the replay calls are
looked up by name (`SGLANG_NAMES`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
import warnings
from typing import Any

import torch

from marconi.engines.real.sglang_options import UsageError

SUPPORTED_VERSION = "0.5.23"


# --- stubs: SGLang imports GPU-only modules at load time ----------------------------------


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__path__ = []  # a package, so its stubbed submodules import
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def _jit(fn: Any = None, **_: Any) -> Any:
    """`@triton.jit` and `@triton.jit(...)`: the kernels are never launched here."""
    return fn if callable(fn) else (lambda f: f)


def _unpinned(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return self


class _StubClass:
    """A base class for the kernel-FFI classes SGLang subclasses at import time."""


def install_stubs() -> None:
    """Make SGLang importable without a GPU. Before the stubs: import torch's compiler
    (it probes for triton once, and must find none) and ask transformers whether
    torchvision exists (cached, so the torchvision stub below is never taken for one)."""
    import torch._dynamo
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    patched: Any = torch  # typed Any: these replace torch's own (typed) callables
    patched.compile = _jit  # decorators only; nothing is compiled or run
    patched.Tensor.pin_memory = _unpinned  # pinning needs an accelerator; nothing is copied
    _stub("triton", jit=_jit, language=_stub("triton.language", constexpr=int))
    sys.modules["triton"].language.extra = _stub("triton.language.extra", libdevice=None)
    _stub("tvm_ffi", Object=_StubClass, Module=_StubClass)  # JIT kernel loader
    _stub("torchvision", transforms=_stub(  # image preprocessing of VLM configs
        "torchvision.transforms", InterpolationMode=None,
        functional=_stub("torchvision.transforms.functional", InterpolationMode=None)))
    _stub("IPython", display=_stub("IPython.display", HTML=None, display=None))


def _skip_frontend_init() -> None:
    """`import sglang` runs the frontend language's `__init__` (aiohttp, IPython,
    tqdm...); an empty package object over the same folder loads `sglang.srt` alone."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations is not None
    package = types.ModuleType("sglang")
    package.__spec__, package.__file__ = spec, spec.origin
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["sglang"] = package


def check_version() -> str:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"sglang is not installed; this worker drives sglang "
                         f"{SUPPORTED_VERSION}") from None
    if version != SUPPORTED_VERSION:
        raise UsageError(f"sglang {version} is installed; this worker drives sglang "
                         f"{SUPPORTED_VERSION} only")
    return version


SGLANG_NAMES = {  # module: the names the replay calls
    "sglang.srt.configs.mamba_utils": ("Mamba2CacheParams", "Mamba2StateShape"),
    "sglang.srt.environ": ("envs",),
    "sglang.srt.managers.schedule_batch": ("Req", "ScheduleBatch"),
    "sglang.srt.managers.schedule_policy": ("PrefillAdder", "SchedulePolicy"),
    "sglang.srt.managers.scheduler_components.batch_result_processor": (
        "SchedulerBatchResultProcessor",),
    "sglang.srt.mem_cache.allocator": ("TokenToKVPoolAllocator",),
    "sglang.srt.mem_cache.allocator.paged": ("PagedTokenToKVPoolAllocator",),
    "sglang.srt.mem_cache.cache_init_params": ("CacheInitParams",),
    "sglang.srt.mem_cache.common": ("checkpoint_kv_cache", "release_kv_cache"),
    "sglang.srt.mem_cache.memory_pool": ("HybridLinearKVPool", "HybridReqToTokenPool"),
    "sglang.srt.mem_cache.unified_cache.components.base": ("ComponentType",),
    "sglang.srt.mem_cache.unified_radix_cache": ("UnifiedRadixCache",),
    "sglang.srt.sampling.sampling_params": ("SamplingParams",),
    "sglang.srt.server_args": ("ServerArgs", "set_global_server_args_for_scheduler"),
    "sglang.srt.speculative.spec_info": ("SpeculativeAlgorithm",),
}


def load_sglang() -> types.SimpleNamespace:
    """The SGLang classes and functions the replay calls, by name."""
    install_stubs()
    _skip_frontend_init()
    found: dict[str, Any] = {}
    with warnings.catch_warnings():  # "Only CUDA ... support AWQ/GGUF": true, and moot here
        warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)
        for module_name, names in SGLANG_NAMES.items():
            module = importlib.import_module(module_name)
            found.update({name: getattr(module, name) for name in names})
    return types.SimpleNamespace(**found)
