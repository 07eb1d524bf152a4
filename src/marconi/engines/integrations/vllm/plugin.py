"""The vLLM plugin's entry point (`vllm.general_plugins` in pyproject.toml): `plugin` reads
what the environment asks (`MARCONI_VLLM`, `MARCONI_MODEL`, `MARCONI_ALPHA`,
`MARCONI_ORPHANS`, `MARCONI_TUNER`, `MARCONI_VLLM_CPU_SPLIT`), refuses a bad setting with
one line, and installs (`hooks`)."""

from __future__ import annotations

import os

from marconi.engines.integrations.common import POLICIES, IntegrationError, asked, one_line_exit
from marconi.engines.integrations.vllm.hooks import (
    CPU_SPLIT,
    install,
    installed,
    split_prefills_on_cpu,
)
from marconi.engines.integrations.vllm.versions import WHO, log

ENABLE = "MARCONI_VLLM"  # "marconi": install at plugin load
ORPHANS = "MARCONI_ORPHANS"  # "keep": orphan KV left in vLLM's order (default "first")
TUNER = "MARCONI_TUNER"  # where the tuner runs: "process" (the default) or "thread"


def plugin() -> None:
    """vLLM's general-plugin entry point: install when `MARCONI_VLLM` asks, and switch the
    CPU build's mid-prefill Mamba checkpoint off when `MARCONI_VLLM_CPU_SPLIT=1` asks
    (either without the other). A bad setting stops the process with one line. vLLM loads
    plugins in several processes and may call this more than once in one; a second call
    in a process changes nothing."""
    if installed.current is not None:
        return
    with one_line_exit():
        split = os.environ.get(CPU_SPLIT, "")
        if split not in ("", "0", "1"):
            raise IntegrationError(f"{WHO}: {CPU_SPLIT}={split!r} is not 0 or 1")
        if split == "1":
            split_prefills_on_cpu()
        wanted = asked(WHO, ENABLE)
        if wanted is None:
            return
        orphans = os.environ.get(ORPHANS, "first")
        if orphans not in ("first", "keep"):
            raise IntegrationError(f"{WHO}: {ORPHANS}={orphans!r} is not first or keep")
        where = os.environ.get(TUNER, "process")
        if where not in ("process", "thread"):
            raise IntegrationError(f"{WHO}: {TUNER}={where!r} is not process or thread")
        install(wanted.spec, policy=wanted.policy, alpha=wanted.alpha,
                orphans_first=orphans == "first", process=where == "process")
        if wanted.policy not in POLICIES:  # a declared priority: no alpha, no tuner
            log.info("marconi: on in this process (pid %d): policy %s (a declared "
                     "priority over the Mamba states), model %s, orphan KV in vLLM's order",
                     os.getpid(), wanted.policy, wanted.spec.name)
            return
        tuned = (f"fixed at {wanted.alpha:g}" if wanted.alpha is not None else
                 "chosen by marconi+'s shadow experts" if wanted.policy == "marconi+" else
                 "bootstrap-tuned")
        log.info("marconi: on in this process (pid %d): policy %s, model %s, alpha %s%s, "
                 "orphan KV %s", os.getpid(), wanted.policy, wanted.spec.name, tuned,
                 "" if wanted.alpha is not None else f" (tuner in a {where})",
                 "first" if orphans == "first" else "in vLLM's order")
