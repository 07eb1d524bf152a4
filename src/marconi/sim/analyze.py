"""`marconi analyze`: a trace's reuse taxonomy and infinite-cache bound, no policy involved."""

from __future__ import annotations

from typing import Any

import numpy as np

from marconi.core.spec import ModelSpec
from marconi.sim.bounds import SeenTree
from marconi.workload.types import Trace


def taxonomy(n: np.ndarray, seen: np.ndarray, from_inputs: np.ndarray) -> dict[str, int]:
    """Input tokens by the paper's reuse classes: a request's reused prefix is purely input
    when it lies inside an earlier input, else it includes an earlier output."""
    pure = from_inputs >= seen
    return {"purely_input": int(seen[pure].sum()), "input_and_output": int(seen[~pure].sum()),
            "none": int((n - seen).sum())}


def analyze(trace: Trace, spec: ModelSpec) -> dict[str, Any]:
    """Split every input token into purely-input reuse, input-and-output reuse, or none.

    An infinite cache keeping every prefix ever seen hits `seen` tokens of a request; they
    are purely-input reuse when all of them lie inside an earlier request's input (system
    prompts, shared documents), else input-and-output reuse (conversations, agents).
    """
    tree = SeenTree()
    n = np.zeros(len(trace), dtype=np.int64)
    seen = np.zeros_like(n)
    inputs_only = np.zeros_like(n)
    for i, request in enumerate(trace):
        found = tree.lookup(request.input_tokens)
        n[i], seen[i], inputs_only[i] = request.n_input, found.seen, found.from_inputs
        tree.commit(request.tokens(), request.n_input)
    flops_total = float(spec.flops_array(n).sum())
    return {
        "trace": trace.name, "requests": len(trace), "input_tokens": int(n.sum()),
        "reuse_taxonomy": taxonomy(n, seen, inputs_only),
        "bound_token_hit_rate": float(seen.sum() / n.sum()) if n.sum() else 0.0,
        "bound_flops_saved_rate": (float(spec.flops_array(seen).sum()) / flops_total
                                   if flops_total else 0.0),
    }
