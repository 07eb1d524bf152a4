"""The reference engine: one request at a time, with a `PrefixCache` in the loop.

```
lookup -> restore (KV of the path + the hit node's state) -> prefill input[hit:] capturing
plan.checkpoints -> first token (TTFT) -> decode (feeding every output token, so the state
after the whole sequence exists) -> states inside the output -> commit -> unpin
```
An exact-repeat prompt (`hit == len(prompt)`) needs no prefill: every state carries the
next-token logits it was taken with, so the first token is still exact. States the cache
wants inside a generated output are replayed from the end-of-prefill state: one
multi-token forward over the few output tokens, split at those positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from marconi.core.cache import Plan
from marconi.core.layout import Layout
from marconi.core.spec import ModelSpec
from marconi.core.tokens import Tokens, as_tokens
from marconi.core.tree import Node
from marconi.core.tuning import Tuner
from marconi.core.units import parse_size
from marconi.engines.hf.models import HybridModel
from marconi.engines.hf.paged_store import PagedStore
from marconi.engines.hf.prefill import Capture, PrefillResult, forward, prefill
from marconi.engines.hf.sampling import Sampling, sample
from marconi.engines.hf.state import SSMState, restore, snapshot_kv, snapshot_state
from marconi.engines.hf.tensor_store import KVSource, TensorStore
from marconi.systems import get_system

EngineStore = TensorStore | PagedStore  # a StateStore plus track / state / gather

OnToken = Callable[[int], bool]  # called per generated token; False: stop after it


@dataclass(slots=True)
class Timings:
    """Seconds spent per phase of one request; `ttft` is lookup through first logits.

    ```
    ttft = lookup + restore + prefill (= one piece + split) + snapshot + first sample
    after the first token: decode, replay, commit
    ```
    """

    lookup: float = 0.0
    restore: float = 0.0
    prefill: float = 0.0  # model forward over input[hit:], in `segments` pieces
    segments: int = 0  # forward calls of the prefill (1: not split)
    split: float = 0.0  # of `prefill`, the cost of the pieces beyond one forward (measured
    # only when the engine is asked to: `Engine(measure_split=True)`)
    snapshot: float = 0.0  # cloning captured states
    ttft: float = 0.0
    decode: float = 0.0
    replay: float = 0.0  # recomputing states inside the output
    commit: float = 0.0

    @property
    def overhead_in_ttft(self) -> float:
        """What the cache added before the first token: lookup, restore, split, snapshots."""
        return self.lookup + self.restore + self.split + self.snapshot

    @property
    def overhead(self) -> float:
        """Everything the cache added: before the first token, then replay and commit."""
        return self.overhead_in_ttft + self.replay + self.commit


@dataclass(frozen=True, slots=True)
class Generation:
    """One request's result."""

    output: Tokens  # generated (or forced) output tokens
    logits: torch.Tensor  # (steps, vocab): logits that chose each generated token
    hit: int  # prompt tokens reused from the cache
    n_input: int
    admitted: tuple[int, ...]  # positions that gained a state at commit
    timings: Timings = field(default_factory=Timings)


class Engine:
    """A model plus a prefix cache backed by a `TensorStore`, or by a `PagedStore` when the
    cache's layout has pages or state slots."""

    def __init__(self, model: HybridModel, system: str = "marconi", capacity: int | str = "1GB",
                 *, capture: Capture = Capture.EXACT, alpha: float | None = None,
                 tuner: Tuner | None = None, tune: bool = True, page_size: int | None = None,
                 state_slots: int | None = None, measure_split: bool = False) -> None:
        """`tuner` observes every commit; with none given and `tune`, the system's own
        (none when `alpha` is fixed or the system has nothing to tune), which never blocks
        a commit. `page_size`, `state_slots`: the cache's layout (None: the system's).
        `measure_split`: after each split prefill, time one unsplit forward over the same
        tokens (after the request: TTFT unaffected) to fill `Timings.split` (benchmarks)."""
        self.model = model
        self.measure_split = measure_split
        # each state keeps its next-token logits (float32): the capacity must bound them too
        spec = model.spec.replace(checkpoint_extra_bytes=4 * model.vocab_size)
        named = get_system(system)
        layout = named.layout(spec, capacity, page_size=page_size, state_slots=state_slots)
        self.store: EngineStore = _store(model, spec, parse_size(capacity), layout)
        self.cache = named.cache(spec, capacity, alpha=alpha, store=self.store, layout=layout)
        if tuner is None and tune:
            tuner = named.make_tuner(alpha)
        self.tuner = tuner
        self.capture = capture

    def generate(self, prompt: object, max_new_tokens: int = 16,
                 sampling: Sampling | None = None, output: object = None,
                 on_token: OnToken | None = None,
                 boundaries: Sequence[int] = ()) -> Generation:
        """Serve one request; `output` given: teacher-force it instead of decoding.

        `on_token(token)` is called with each generated token as soon as it is chosen;
        returning False stops decoding after that token (a stop token, a client gone), so
        the output may be shorter than `max_new_tokens`. Mutates the cache (lookup clock,
        commit, evictions). `boundaries` are message ends inside the prompt (a chat
        template knows them), for admission policies that checkpoint there (marconi+).
        Raises ValueError for bad tokens or a sequence longer than the model accepts.
        """
        tokens, forced = self._validate(prompt, max_new_tokens, output)
        timings, t0 = Timings(), time.perf_counter()
        plan = self.cache.lookup(tokens, boundaries=boundaries)
        timings.lookup = time.perf_counter() - t0
        self.cache.pin(plan.node)
        try:
            return self._serve(tokens, plan, forced, max_new_tokens, sampling, timings, t0,
                               on_token, tuple(boundaries))
        finally:
            self.cache.unpin(plan.node)

    def _serve(self, tokens: Tokens, plan: Plan, forced: Tokens | None, steps: int,
               sampling: Sampling | None, timings: Timings, t0: float,
               on_token: OnToken | None, boundaries: tuple[int, ...] = ()) -> Generation:
        n_input = len(tokens)
        result = self._prefill(tokens, plan, forced, timings)
        first = sample(result.logits, sampling, 0)
        timings.ttft = time.perf_counter() - t0
        if forced is None:
            node = plan.node if plan.hit == n_input else None
            base = self.store.state(node.state) if node is not None else None
            base = result.states.get(n_input, base)  # the state after the prompt
            out, logits = self._decode(tokens, result, base, first, steps, sampling, timings,
                                       on_token)
        else:
            out, logits = forced, result.logits[None]
            self._feed_forced(tokens, forced, result, timings)
        full = np.concatenate([tokens, out]).astype(np.int32)
        t1 = time.perf_counter()
        states = {p: self.store.track(s) for p, s in result.states.items()}
        committed = self.cache.commit(full, n_input, states=states, kv=KVSource(result.cache),
                                      boundaries=boundaries)
        if self.tuner is not None:
            self.tuner.observe(self.cache, full, n_input, boundaries)
        timings.commit = time.perf_counter() - t1
        if self.measure_split:
            self._measure_split(tokens, plan, timings)
        return Generation(out, logits, plan.hit, n_input, committed.admitted, timings)

    def _prefill(self, tokens: Tokens, plan: Plan, forced: Tokens | None,
                 timings: Timings) -> PrefillResult:
        """Restore the hit and prefill the rest, capturing the planned states."""
        t0 = time.perf_counter()
        cache, state = self._restore(plan)
        timings.restore = time.perf_counter() - t0
        n_input = len(tokens)
        if state is not None and plan.hit == n_input:  # exact repeat: nothing to compute
            return PrefillResult(cache, state.logits)  # the state stays the cache's
        caching = self.cache.admission.caches
        wanted = {*plan.checkpoints, n_input} if caching else set()  # n_input: output replays
        if forced is not None:
            full = np.concatenate([tokens, forced])
            wanted |= set(self.cache.required_states(full, n_input))
        result = prefill(self.model, torch.from_numpy(tokens).long(), cache, plan.hit, wanted,
                         self.capture)
        timings.prefill, timings.snapshot = result.forward_s, result.snapshot_s
        timings.segments = result.segments
        return result

    def _restore(self, plan: Plan) -> tuple[DynamicCache, SSMState | None]:
        return self.restored(plan.node)

    def restored(self, node: Node | None) -> tuple[DynamicCache, SSMState | None]:
        """A fresh model cache holding a node's prefix: its path's KV (the edges, gathered
        in order) and its state; empty for None. Reads the cache, changes nothing."""
        state = self.store.state(node.state) if node is not None else None
        kv = self.store.gather([n.kv for n in self.cache.path(node)]) if state else None
        return restore(self.model, kv, state), state

    def _measure_split(self, tokens: Tokens, plan: Plan, timings: Timings) -> None:
        """`timings.split`: the prefill's time beyond one forward over input[hit:] from the
        same restored state (the pieces' extra launches and shorter matmuls)."""
        if timings.segments <= 1:
            return
        cache, _ = self._restore(plan)
        t0 = time.perf_counter()
        forward(self.model, cache, torch.from_numpy(tokens[plan.hit :]).long(), plan.hit)
        timings.split = max(0.0, timings.prefill - (time.perf_counter() - t0))

    def _decode(self, tokens: Tokens, result: PrefillResult, base: SSMState | None, first: int,
                steps: int, sampling: Sampling | None, timings: Timings,
                on_token: OnToken | None = None) -> tuple[Tokens, torch.Tensor]:
        """Greedy/sampled decode; feeds every output token, then captures output states."""
        t0, n_input = time.perf_counter(), len(tokens)
        out, logits, token = [], [result.logits], first
        for step in range(steps):
            out.append(token)
            more = on_token is None or on_token(token)
            step_logits = forward(self.model, result.cache, torch.tensor([token]), n_input + step)
            if not more or step + 1 == steps:
                break
            logits.append(step_logits)
            token = sample(step_logits, sampling, step + 1)
        end = n_input + len(out)
        if self.cache.admission.caches:
            result.states[end] = snapshot_state(self.model, result.cache, end, step_logits)
        timings.decode = time.perf_counter() - t0
        output = np.asarray(out, dtype=np.int32)
        self._replay_output(tokens, output, result, base, timings)
        return output, torch.stack(logits)

    def _replay_output(self, tokens: Tokens, out: Tokens, result: PrefillResult,
                       base: SSMState | None, timings: Timings) -> None:
        """Capture the states the cache wants strictly inside the output."""
        t0, n_input = time.perf_counter(), len(tokens)
        full = np.concatenate([tokens, out])
        inside = [p for p in self.cache.required_states(full, n_input)
                  if n_input < p < len(full)]
        if inside and base is not None:
            kv = snapshot_kv(self.model, result.cache, 0, n_input)
            replay = prefill(self.model, torch.from_numpy(full[: max(inside)]).long(),
                             restore(self.model, kv, base), n_input, inside)
            result.states.update(replay.states)
        timings.replay = time.perf_counter() - t0

    def _feed_forced(self, tokens: Tokens, forced: Tokens, result: PrefillResult,
                     timings: Timings) -> None:
        """Teacher-force a known output, capturing the states inside it and at its end."""
        t0 = time.perf_counter()
        full = np.concatenate([tokens, forced])
        wanted = [*self.cache.required_states(full, len(tokens))]
        fed = prefill(self.model, torch.from_numpy(full).long(), result.cache, len(tokens),
                      wanted)
        result.states.update(fed.states)
        timings.decode = time.perf_counter() - t0

    def _validate(self, prompt: object, steps: int,
                  output: object) -> tuple[Tokens, Tokens | None]:
        tokens = as_tokens(prompt, what="prompt")
        forced = None if output is None else as_tokens(output, what="output")
        n_out = steps if forced is None else len(forced)
        if len(tokens) == 0 or n_out <= 0:
            raise ValueError("a request needs at least one prompt token and one output token")
        for name, arr in (("prompt", tokens), ("output", forced)):
            if arr is not None and len(arr) and int(arr.max()) >= self.model.vocab_size:
                raise ValueError(f"{name} token {int(arr.max())} outside the model's vocabulary "
                                 f"of {self.model.vocab_size}")
        if len(tokens) + n_out > self.model.max_context:
            raise ValueError(f"prompt of {len(tokens)} tokens + {n_out} output tokens exceeds "
                             f"the model's limit of {self.model.max_context}")
        return tokens, forced


def _store(model: HybridModel, spec: ModelSpec, capacity: int, layout: Layout) -> EngineStore:
    """A `TensorStore` for the byte budget; a `PagedStore` sized by the layout otherwise
    (pages: the KV budget in whole pages; slots: the pool's)."""
    if layout == Layout():
        return TensorStore(model)
    pages = layout.kv_capacity(spec, capacity) // (layout.page_size * spec.kv_bytes_per_token)
    return PagedStore(model, layout.page_size, pages=pages,
                      slots=layout.state_slots if layout.pooled else None)
