"""`summarize(trace)`: the handful of numbers reports print about a trace."""

from __future__ import annotations

from marconi.workload.types import Trace


def summarize(trace: Trace) -> dict[str, object]:
    """Requests, sessions, token totals and input lengths (0 for an empty trace)."""
    n_in = [r.n_input for r in trace]
    n_out = [r.n_output for r in trace]
    return {
        "name": trace.name,
        "requests": len(trace),
        "sessions": trace.sessions,
        "input_tokens": sum(n_in),
        "output_tokens": sum(n_out),
        "mean_input_tokens": sum(n_in) / len(n_in) if n_in else 0.0,
        "max_input_tokens": max(n_in, default=0),
        "mean_output_tokens": sum(n_out) / len(n_out) if n_out else 0.0,
        "duration_s": (trace[-1].arrival - trace[0].arrival) if len(trace) else 0.0,
    }
