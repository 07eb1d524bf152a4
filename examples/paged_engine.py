"""A small paged engine with marconi's prefix cache in the loop (docs/embedding.md).

KV lives in a pool of pages and SSM states in a pool of slots (`PagedStore`, a
`StateStore`); the cache decides what to reuse, what to capture and what to keep. Every
request's logits are checked against one uncached forward of the model.

    python examples/paged_engine.py [--system marconi] [--page-size 16] [--state-slots 8]

Needs the `engine` extra (torch, transformers); builds a tiny random-weight Bamba.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch

from marconi import make_cache
from marconi.core.cache import Plan, PrefixCache
from marconi.core.tuning import Tuner
from marconi.engines.hf import HybridModel, KVSource, restore, snapshot_kv, tiny_model
from marconi.engines.hf.paged_store import PagedStore
from marconi.engines.hf.prefill import PrefillResult, forward, prefill
from marconi.engines.hf.state import snapshot_state
from marconi.systems import get_system


@dataclass(frozen=True, slots=True)
class Served:
    output: np.ndarray  # greedy tokens
    logits: torch.Tensor  # (len(output), vocab): the logits that chose them
    hit: int  # prompt tokens the cache served


class PagedEngine:
    """One request at a time (one thread drives the cache and its store)."""

    def __init__(self, model: HybridModel, system: str, capacity: int, page_size: int,
                 state_slots: int) -> None:
        self.model = model
        spec = model.spec.replace(checkpoint_extra_bytes=4 * model.vocab_size)  # + logits
        kv_budget = capacity - state_slots * spec.ssm_bytes
        self.store = PagedStore(model, page_size, slots=state_slots or None,
                                pages=kv_budget // (page_size * spec.kv_bytes_per_token))
        self.cache: PrefixCache = make_cache(spec, capacity, system, store=self.store,
                                             page_size=page_size, state_slots=state_slots)
        self.tuner: Tuner | None = get_system(system).make_tuner()  # never blocks a commit

    def serve(self, prompt: np.ndarray, steps: int, salt: str | None = None) -> Served:
        plan = self.cache.lookup(prompt, salt=salt)
        self.cache.pin(plan.node)  # the hit's path must outlive this request
        try:
            live, output, logits = self._run(prompt, plan, steps, salt)
            full = np.concatenate([prompt, output]).astype(np.int32)
            states = self._states(live, prompt, full, salt)
            self.cache.commit(full, len(prompt), states=states, kv=KVSource(live.cache),
                              salt=salt)
            if self.tuner is not None:
                self.tuner.observe(self.cache, full, len(prompt))
        finally:
            self.cache.unpin(plan.node)
        return Served(output, logits, plan.hit)

    def _run(self, prompt: np.ndarray, plan: Plan, steps: int,
             salt: str | None) -> tuple[PrefillResult, np.ndarray, torch.Tensor]:
        """Restore the hit, prefill the rest capturing the plan's checkpoints and the
        prompt's end, then decode greedily, feeding every output token."""
        live = self._restore(plan)
        n = len(prompt)
        if plan.hit < n:
            live = prefill(self.model, torch.from_numpy(prompt).long(), live.cache, plan.hit,
                           {*plan.checkpoints, n})
        logits, out = [live.logits], []
        for step in range(steps):
            out.append(int(logits[-1].argmax()))
            last = forward(self.model, live.cache, torch.tensor(out[-1:]), n + step)
            logits.append(last)
        live.logits = logits.pop()  # after the last token: the end state's logits
        return live, np.asarray(out, dtype=np.int32), torch.stack(logits)

    def _restore(self, plan: Plan) -> PrefillResult:
        """A live model cache holding the hit's KV (gathered from pages) and state."""
        if plan.node is None:
            return PrefillResult(self.model.new_cache(), torch.empty(0))
        state = self.store.state(plan.node.state)
        kv = self.store.gather([node.kv for node in self.cache.path(plan.node)])
        result = PrefillResult(restore(self.model, kv, state), state.logits)
        result.states[plan.hit] = state
        return result

    def _states(self, live: PrefillResult, prompt: np.ndarray, full: np.ndarray,
                salt: str | None) -> dict:
        """The states the commit will admit: captured in prefill, the end of the sequence,
        and positions inside the output (replayed from the prompt's end state)."""
        n, end = len(prompt), len(full)
        wanted = self.cache.required_states(full, n, salt=salt)
        captured = dict(live.states)
        captured[end] = snapshot_state(self.model, live.cache, end, live.logits)
        inside = [p for p in wanted if n < p < end]
        if inside:
            kv = snapshot_kv(self.model, live.cache, 0, n)
            replay = prefill(self.model, torch.from_numpy(full[: max(inside)]).long(),
                             restore(self.model, kv, captured[n]), n, inside)
            captured.update(replay.states)
        return {p: self.store.track(captured[p]) for p in wanted}  # slots, owned by the cache


def uncached_logits(model: HybridModel, prompt: np.ndarray, output: np.ndarray) -> torch.Tensor:
    """The logits that choose each output token, from one forward with no cache at all."""
    ids = torch.from_numpy(np.concatenate([prompt, output])[:-1]).long()[None]
    with torch.inference_mode():
        logits = model.module(input_ids=ids, use_cache=False).logits[0].float()
    return logits[len(prompt) - 1 :]


def workload(rng: np.random.Generator, vocab: int) -> list[tuple[np.ndarray, str | None]]:
    """A shared system prompt, branches off it, a growing prompt, and a second tenant."""
    system = rng.integers(0, vocab, 45)
    out, history = [], system
    for turn in range(6):
        branch = np.concatenate([system, rng.integers(0, vocab, 9 + turn)])
        history = np.concatenate([history, rng.integers(0, vocab, 7)])
        out += [(branch, None), (history, None), (branch, "tenant-b")]
    return [(p.astype(np.int32), salt) for p, salt in out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="marconi")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--state-slots", type=int, default=8)
    parser.add_argument("--kv-pages", type=int, default=24, help="KV budget in pages")
    args = parser.parse_args(argv)
    model = tiny_model("bamba", seed=0)
    state = model.spec.ssm_bytes + 4 * model.vocab_size
    page = args.page_size * model.spec.kv_bytes_per_token
    engine = PagedEngine(model, args.system, args.kv_pages * page + args.state_slots * state,
                         args.page_size, args.state_slots)
    worst = 0.0
    for prompt, salt in workload(np.random.default_rng(0), model.vocab_size):
        served = engine.serve(prompt, steps=4, salt=salt)
        worst = max(worst, float((served.logits - uncached_logits(
            model, prompt, served.output)).abs().max()))
        print(f"{len(prompt):4d} tokens, hit {served.hit:3d}, salt {salt!s:8}, "
              f"pages {engine.store.pool.in_use:3d}, slots {engine.store.slots_in_use}")
    print(f"largest logit difference from uncached runs: {worst:.1e}")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
