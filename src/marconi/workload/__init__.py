"""Workloads: trace readers (one per format), tokenizers, synthetic generators.

Entry point: `load_trace(path_or_name, format=None, options=TraceOptions())`.
"""

from __future__ import annotations

from marconi.workload.errors import TraceError
from marconi.workload.options import TraceOptions
from marconi.workload.registry import FORMATS, FormatSpec, infer_format, load_trace
from marconi.workload.summary import summarize
from marconi.workload.types import Request, Trace, as_tokens

__all__ = [
    "FORMATS",
    "FormatSpec",
    "Request",
    "Trace",
    "TraceError",
    "TraceOptions",
    "as_tokens",
    "infer_format",
    "load_trace",
    "summarize",
]
