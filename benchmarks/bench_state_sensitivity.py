"""How far a wrong restored state moves the tiny test models' logits, and how close a
right one stays to an uncached forward (`engine.models.make_state_matter`).

Per family and seed: restore a 30-token prefix, zero its recurrent (or conv) state, and
take the next token's logits against the intact restore's (`recurrent`, `conv`: max abs
difference); then continue 10 tokens from the intact restore against one uncached
forward over all 40 (`exact`). `--plain` also runs transformers' own initialization.

    .venv/bin/python benchmarks/bench_state_sensitivity.py [--seeds 3] [--plain]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from marconi.engines.hf import HybridModel, SSMState, restore, snapshot_kv, tiny_model
from marconi.engines.hf.models import ARCHITECTURES
from marconi.engines.hf.prefill import forward, prefill

PREFIX, NEXT = 30, 10


def measure(model: HybridModel, seed: int) -> tuple[float, float, float]:
    tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, PREFIX + NEXT)).long()
    done = prefill(model, tokens[:PREFIX], model.new_cache(), 0, [PREFIX])
    state, kv = done.states[PREFIX], snapshot_kv(model, done.cache, 0, PREFIX)
    right = forward(model, restore(model, kv, state), tokens[PREFIX : PREFIX + 1], PREFIX)
    moved = []
    for part in ("recurrent", "conv"):
        conv = tuple(torch.zeros_like(t) if part == "conv" else t for t in state.conv)
        rec = tuple(torch.zeros_like(t) if part == "recurrent" else t for t in state.recurrent)
        wrong = forward(model, restore(model, kv, SSMState(PREFIX, conv, rec, state.logits)),
                        tokens[PREFIX : PREFIX + 1], PREFIX)
        moved.append(float((wrong - right).abs().max()))
    cached = forward(model, restore(model, kv, state), tokens[PREFIX:], PREFIX)
    full = forward(model, model.new_cache(), tokens, 0)
    return moved[0], moved[1], float((cached - full).abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--plain", action="store_true",
                        help="also transformers' initialization (stateful=False)")
    args = parser.parse_args(argv)
    print(f"{'family':<18}{'weights':<10}{'seed':>5}{'recurrent':>12}{'conv':>12}{'exact':>12}")
    for stateful in (True, False) if args.plain else (True,):
        for arch in sorted(ARCHITECTURES):
            for seed in range(args.seeds):
                model = tiny_model(arch, seed=seed, stateful=stateful)
                rec, conv, exact = measure(model, seed)
                print(f"{arch:<18}{'stateful' if stateful else 'plain':<10}{seed:>5}"
                      f"{rec:>12.2e}{conv:>12.2e}{exact:>12.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
