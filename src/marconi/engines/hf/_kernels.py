"""transformers' reference-kernel notices, said once in marconi's words.

Without the optional CUDA kernel packages (causal_conv1d, mamba_ssm,
flash-linear-attention), transformers runs its reference PyTorch implementations of the
SSM scan and conv, exact and slower, and says so once per function: four lines at the
first forward of a Mamba2-family model, two more for Qwen3-Next. Those packages must
stay out of a CPU environment (transformers switches to their CUDA-only kernels when
they are present), so the notice is expected here: the engine drops transformers' lines
and logs one of its own on the `marconi.engines.hf` logger, at INFO (`marconi serve` shows
it; a library user sees it only with logging at INFO).
"""

from __future__ import annotations

import logging

FALLBACK = "is falling back to its reference PyTorch implementation"
SOURCE = "transformers.integrations.hub_kernels"  # the logger transformers says it on
NOTICE = ("transformers runs its reference PyTorch kernels for the SSM layers (no "
          "causal_conv1d / mamba_ssm / flash-linear-attention installed): exact, slower "
          "than the CUDA kernels")
log = logging.getLogger("marconi.engines.hf")


class OnceInOurWords(logging.Filter):
    """Drops transformers' per-function fallback notices; the first one dropped becomes
    `NOTICE`, logged once."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if FALLBACK not in record.getMessage():
            return True
        if not self.said:
            self.said = True
            log.info(NOTICE)
        return False


def install() -> OnceInOurWords:
    """Put the filter on transformers' kernel logger (once per process)."""
    source = logging.getLogger(SOURCE)
    for existing in source.filters:
        if isinstance(existing, OnceInOurWords):
            return existing
    quiet = OnceInOurWords()
    source.addFilter(quiet)
    return quiet
