"""Synthetic workloads for shapes real traces lack; token ids directly, deterministic by seed.

`synthetic:NAME[:k=v,...]` (or `TraceOptions.params`) picks a generator and overrides its
defaults; `sessions` defaults to `TraceOptions.sessions` (100). Session i starts at
i / sps; calls inside a session have Poisson gaps of mean `mean_gap`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.conversation import Conversation, add_conversation
from marconi.workload.options import TraceOptions
from marconi.workload.types import Tokens

Params = dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Generator:
    """A named generator, its parameters with defaults, and what it builds."""

    name: str
    description: str
    defaults: Params
    build: Callable[[TraceBuilder, Params, TraceOptions, np.random.Generator], None]

    def read(self, source: Path | None, options: TraceOptions) -> Built:
        params = resolve(self, options)
        builder = TraceBuilder()
        self.build(builder, params, options, np.random.default_rng(options.seed))
        meta: dict[str, object] = {"format": f"synthetic:{self.name}", "params": params}
        return builder.build(f"synthetic:{self.name}", meta)


def parse_params(text: str) -> dict[str, str]:
    """`a=1,b=2` -> {a: '1', b: '2'}."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"synthetic parameter {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def resolve(gen: Generator, options: TraceOptions) -> Params:
    """Defaults overridden by `options.params`; unknown keys and negatives are errors."""
    params = {"sessions": float(options.sessions or 100), **gen.defaults}
    for key, value in options.params.items():
        if key not in params:
            raise ValueError(
                f"synthetic:{gen.name}: unknown parameter {key!r}; known: {sorted(params)}"
            )
        try:
            params[key] = float(value)
        except ValueError as err:
            raise ValueError(f"synthetic:{gen.name}: {key}={value!r} is not a number") from err
        if params[key] < 0:
            raise ValueError(f"synthetic:{gen.name}: {key} must be >= 0, got {value}")
    return params


def _tokens(rng: np.random.Generator, n: float, opts: TraceOptions) -> Tokens:
    return rng.integers(3, opts.vocab_size, size=max(int(n), 1), dtype=np.int32)


def _length(rng: np.random.Generator, mean: float) -> int:
    """A length around `mean` (geometric-ish spread, at least 1)."""
    return max(1, int(rng.exponential(mean))) if mean > 0 else 1


def _start(i: int, opts: TraceOptions) -> float:
    return i / opts.sps


def _chain(
    builder: TraceBuilder,
    sid: str,
    roles: list[str],
    parts: list[Tokens],
    start: float,
    opts: TraceOptions,
    rng: np.random.Generator,
) -> None:
    """A session whose calls are its `assistant` parts, as views into one buffer."""
    conv = Conversation(sid, tuple(roles), ("",) * len(roles))
    gaps = rng.exponential(opts.mean_gap, size=max(len(conv.calls) - 1, 0))
    arrivals = [start, *(start + np.cumsum(gaps)).tolist()]
    add_conversation(builder, conv, parts, arrivals, opts.max_input_tokens)


def _single(
    builder: TraceBuilder, sid: str, prompt: list[Tokens], out: Tokens, arrival: float
) -> None:
    base = builder.add_buffer(np.concatenate([*prompt, out]))
    builder.add_marks(base, np.cumsum([p.shape[0] for p in prompt])[:-1])  # e.g. system end
    n_in = sum(p.shape[0] for p in prompt)
    builder.add_request(sid, 0, arrival, (base, base + n_in), (base + n_in, base + n_in + len(out)))


def _system_prompt(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    prompts = [_tokens(rng, p["prompt_len"], o) for _ in range(max(int(p["prompts"]), 1))]
    for i in range(int(p["sessions"])):
        shared = prompts[int(rng.integers(len(prompts)))]
        query, out = _tokens(rng, _length(rng, p["query_len"]), o), _tokens(rng, p["output_len"], o)
        _single(b, f"sp{i}", [shared, query], out, _start(i, o))


def _multi_turn(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    system = _tokens(rng, p["system_len"], o)
    for i in range(int(p["sessions"])):
        roles, parts = ["system"], [system]
        for _ in range(int(p["turns"])):
            roles += ["user", "assistant"]
            parts += [
                _tokens(rng, _length(rng, p["user_len"]), o),
                _tokens(rng, _length(rng, p["output_len"]), o),
            ]
        _chain(b, f"chat{i}", roles, parts, _start(i, o), o, rng)


def _agent(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    system = _tokens(rng, p["system_len"], o)
    for i in range(int(p["sessions"])):
        roles, parts = ["system", "user"], [system, _tokens(rng, p["task_len"], o)]
        for _ in range(int(p["steps"])):
            roles += ["assistant", "user"]
            parts += [
                _tokens(rng, _length(rng, p["action_len"]), o),
                _tokens(rng, _length(rng, p["observation_len"]), o),
            ]
        _chain(b, f"agent{i}", roles, parts, _start(i, o), o, rng)


def _rag(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    """Zipf-popular documents, most popular first: requests share 0..k leading documents."""
    n_docs, k = max(int(p["docs"]), 1), int(p["k"])
    docs = [_tokens(rng, p["doc_len"], o) for _ in range(n_docs)]
    weights = 1.0 / np.arange(1, n_docs + 1) ** p["zipf"]
    system = _tokens(rng, p["system_len"], o)
    for i in range(int(p["sessions"])):
        picked = np.sort(
            rng.choice(n_docs, size=min(k, n_docs), replace=False, p=weights / weights.sum())
        )
        query, out = _tokens(rng, p["query_len"], o), _tokens(rng, p["output_len"], o)
        _single(b, f"rag{i}", [system, *(docs[d] for d in picked), query], out, _start(i, o))


def _twice(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    """Prefix j is sent at session slot j and again `distance` slots later, never more."""
    for j in range(int(p["sessions"]) // 2):
        prefix = _tokens(rng, p["prefix_len"], o)
        for copy, slot in (("a", j), ("b", j + int(p["distance"]))):
            suffix, out = _tokens(rng, p["suffix_len"], o), _tokens(rng, p["output_len"], o)
            _single(b, f"twice{j}{copy}", [prefix, suffix], out, _start(slot, o))


def _branching(b: TraceBuilder, p: Params, o: TraceOptions, rng: np.random.Generator) -> None:
    """A conversation, then `branches` edits of an earlier user turn, each continued."""
    turns = max(int(p["turns"]), 1)
    for i in range(int(p["sessions"])):
        roles = ["user", "assistant"] * turns
        parts = [_tokens(rng, _length(rng, p[f"{r}_len"]), o) for r in ("user", "output") * turns]
        _chain(b, f"conv{i}", roles, parts, _start(i, o), o, rng)
        for j in range(int(p["branches"])):
            t = int(rng.integers(turns))  # the edited user turn
            new = [
                _tokens(rng, _length(rng, p[f"{r}_len"]), o)
                for r in ("user", "output") * (turns - t)
            ]
            start = _start(i, o) + (t + 1 + j) * o.mean_gap
            history = ["system"] * (2 * t)  # turns before the edit: context, not calls
            _chain(
                b, f"conv{i}/b{j}", history + roles[2 * t :], parts[: 2 * t] + new, start, o, rng
            )


GENERATORS: dict[str, Generator] = {
    g.name: g
    for g in (
        Generator(
            name="system-prompt",
            build=_system_prompt,
            description="one-shot requests sharing a few long system prompts",
            defaults={"prompts": 4, "prompt_len": 1024, "query_len": 128, "output_len": 128},
        ),
        Generator(
            name="multi-turn",
            build=_multi_turn,
            description="multi-turn chats behind one short system prompt",
            defaults={"turns": 10, "system_len": 256, "user_len": 64, "output_len": 256},
        ),
        Generator(
            name="agent",
            build=_agent,
            description="agent loops: shared system prompt, task, action/observation steps",
            defaults={
                "steps": 20,
                "system_len": 2000,
                "task_len": 400,
                "action_len": 120,
                "observation_len": 600,
            },
        ),
        Generator(
            name="rag",
            build=_rag,
            description="RAG: Zipf-popular documents, partially overlapping prefixes",
            defaults={
                "docs": 200,
                "doc_len": 800,
                "k": 4,
                "zipf": 1.1,
                "system_len": 256,
                "query_len": 64,
                "output_len": 128,
            },
        ),
        Generator(
            name="twice",
            build=_twice,
            description="every long prefix is sent exactly twice, `distance` slots apart",
            defaults={"prefix_len": 2048, "suffix_len": 64, "output_len": 64, "distance": 10},
        ),
        Generator(
            name="branching",
            build=_branching,
            description="conversations re-branched from an earlier user turn",
            defaults={"turns": 8, "branches": 2, "user_len": 64, "output_len": 256},
        ),
    )
}
