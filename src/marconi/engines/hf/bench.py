"""`marconi engine-bench`: TTFT cold vs cached on real model tensors.

Three workloads (deterministic token ids; no tokenizer download: text -> UTF-8 bytes mod
vocab), each replayed under every system with a fresh cache:

- `conversation`: one chat session, each turn's input = the history + a user message;
- `shared-prompt`: many requests that share one long system prompt;
- `agent`: mini-swe-agent trajectories (`../shared/data/mini-swe-agent`; skipped if absent),
  each assistant message one call whose input is every earlier message.

Outputs are teacher-forced (the recorded or generated-once tokens), so every system
computes the same sequences and only the cache differs.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marconi.engines.hf.engine import Engine, Generation
from marconi.engines.hf.models import HybridModel
from marconi.engines.hf.prefill import Capture, forward

Request = tuple[np.ndarray, np.ndarray]  # (input tokens, output tokens)
SYSTEMS = ("vanilla", "vllm+", "sglang+", "marconi")


def text_tokens(text: str, vocab: int) -> np.ndarray:
    """Deterministic text -> ids: UTF-8 bytes mod vocab (a stand-in for a tokenizer)."""
    return (np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32) % vocab)


def conversation(vocab: int, turns: int = 8, user: int = 64, reply: int = 16,
                 seed: int = 0) -> list[Request]:
    rng, history, out = np.random.default_rng(seed), np.zeros(0, np.int32), []
    for _ in range(turns):
        prompt = np.concatenate([history, rng.integers(0, vocab, user)]).astype(np.int32)
        answer = rng.integers(0, vocab, reply).astype(np.int32)
        out.append((prompt, answer))
        history = np.concatenate([prompt, answer])
    return out


def shared_prompt(vocab: int, requests: int = 12, system: int = 500, user: int = 48,
                  reply: int = 8, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab, system)
    return [(np.concatenate([head, rng.integers(0, vocab, user)]).astype(np.int32),
             rng.integers(0, vocab, reply).astype(np.int32)) for _ in range(requests)]


def _content(message: dict) -> str:
    content = message.get("content", "")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def agent(folder: Path, vocab: int, trajectories: int = 2, calls: int = 8,
          message_cap: int = 192) -> list[Request]:
    """Calls of the first `trajectories` runs; each message capped at `message_cap` tokens."""
    out: list[Request] = []
    for path in sorted(folder.glob("trajs/*/*.traj.json"))[:trajectories]:
        out.extend(_calls(json.loads(path.read_text())["messages"], vocab, calls, message_cap))
    return out


def _calls(messages: list[dict], vocab: int, calls: int, cap: int) -> list[Request]:
    out: list[Request] = []
    history: list[np.ndarray] = []
    for message in messages:
        tokens = text_tokens(_content(message), vocab)[:cap]
        if message.get("role") == "assistant" and history and len(tokens):
            out.append((np.concatenate(history), tokens))
            if len(out) == calls:
                break
        history.append(tokens)
    return out


@dataclass(frozen=True, slots=True)
class Row:
    """One (workload, system) run; times summed over its requests unless a percentile."""

    workload: str
    system: str
    requests: int
    input_tokens: int
    hit_tokens: int
    ttft_ms: tuple[float, float, float]  # P5, P50, P95
    bytes_held: int  # tensors held by the cache at the end (KV + states + their logits)
    ttft_total_ms: float  # the run's TTFTs summed: what `vs_vanilla` compares
    lookup_ms: float
    restore_ms: float
    split_ms: float  # prefill time beyond one unsplit forward (pieces at checkpoints)
    snapshot_ms: float  # cloning states out during prefill
    replay_commit_ms: float  # output states and commit (after the first token)
    repeat: int = 0  # which repetition of the whole bench this run belongs to

    @property
    def overhead_share(self) -> float:
        """Share of the summed TTFT the cache added: lookup, restore, split, snapshots."""
        work = self.lookup_ms + self.restore_ms + self.split_ms + self.snapshot_ms
        return work / self.ttft_total_ms if self.ttft_total_ms else 0.0


def run(model: HybridModel, workload: str, requests: Sequence[Request], system: str,
        capacity: str, capture: Capture, profile: list[tuple[int, int, float]]) -> Row:
    """Replay `requests` through a fresh engine; appends (prefilled, cached, ttft) rows."""
    engine = Engine(model, system, capacity, capture=capture, measure_split=True)
    results: list[Generation] = []
    for prompt, answer in requests:
        result = engine.generate(prompt, output=answer)
        results.append(result)
        profile.append((result.n_input - result.hit, result.hit, result.timings.ttft))
    ttft = np.array([r.timings.ttft for r in results]) * 1e3
    total = {k: 1e3 * sum(getattr(r.timings, k) for r in results)
             for k in ("lookup", "restore", "split", "snapshot", "replay", "commit")}
    label = system if capture is Capture.EXACT else f"{system}/chunk"
    return Row(workload, label, len(results), sum(r.n_input for r in results),
               sum(r.hit for r in results),
               (float(np.percentile(ttft, 5)), float(np.percentile(ttft, 50)),
                float(np.percentile(ttft, 95))),
               engine.store.nbytes, float(ttft.sum()), total["lookup"], total["restore"],
               total["split"], total["snapshot"], total["replay"] + total["commit"])


HEADER = ("workload", "system", "reqs", "in_tok", "hit%", "ttft_p50", "ttft_p95", "held_KiB",
          "vs_vanilla", "vs_range", "overhead", "lookup", "restore", "split", "snapshot",
          "repl+commit")


def format_table(rows: Sequence[Row]) -> str:
    """A fixed-width table, one line per (workload, system): TTFT percentiles in ms;
    `vs_vanilla`, the change of the summed TTFT against the same workload's vanilla run
    of the same repetition (-40%: 40% less time to first tokens), the median over the
    repetitions, and `vs_range` its lowest and highest (one run: -); `overhead`, the
    cache's share of the summed TTFT; the last columns, ms summed. Where a system ran
    more than once, the other columns are those of its median run (by summed TTFT)."""
    vanilla = {(r.workload, r.repeat): r.ttft_total_ms for r in rows if r.system == "vanilla"}
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.workload, r.system), []).append(r)
    lines = [" ".join(f"{h:>11}" for h in HEADER)]
    for runs in groups.values():
        r = sorted(runs, key=lambda run: run.ttft_total_ms)[(len(runs) - 1) // 2]
        changes = [100 * (run.ttft_total_ms / base - 1) for run in runs
                   if (base := vanilla.get((run.workload, run.repeat)))]
        change = f"{float(np.median(changes)):+.1f}%" if changes else "-"
        spread = f"{min(changes):+.0f}..{max(changes):+.0f}%" if len(changes) > 1 else "-"
        cells = (r.workload, r.system, r.requests, r.input_tokens,
                 f"{100 * r.hit_tokens / max(1, r.input_tokens):.1f}",
                 *(f"{t:.1f}" for t in r.ttft_ms[1:]), f"{r.bytes_held / 1024:.0f}",
                 change, spread, f"{100 * r.overhead_share:.1f}%", f"{r.lookup_ms:.2f}",
                 f"{r.restore_ms:.2f}", f"{r.split_ms:.2f}", f"{r.snapshot_ms:.2f}",
                 f"{r.replay_commit_ms:.2f}")
        lines.append(" ".join(f"{c!s:>11}" for c in cells))
    return "\n".join(lines)


def write_profile(path: Path, profile: Sequence[tuple[int, int, float]]) -> None:
    """The simulator's TTFT profile: one row per request of every run."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("tokens_to_prefill", "cached_tokens", "seconds"))
        writer.writerows((p, c, f"{s:.6f}") for p, c, s in profile)


def workloads(model: HybridModel, agent_dir: Path | None) -> dict[str, list[Request]]:
    """The benchmark's workloads; `agent` only when its data folder exists."""
    out = {"conversation": conversation(model.vocab_size),
           "shared-prompt": shared_prompt(model.vocab_size)}
    if agent_dir is not None and agent_dir.is_dir():
        out["agent"] = agent(agent_dir, model.vocab_size)
    return out


def warm_up(model: HybridModel) -> None:
    """One throwaway forward, so first-call costs don't land in the first TTFT."""
    import torch

    forward(model, model.new_cache(), torch.arange(64) % model.vocab_size, 0)


def bench(model: HybridModel, agent_dir: Path | None, systems: Sequence[str], capacity: str,
          chunk_too: bool, profile_path: Path | None, repeat: int = 1,
          say: Callable[[str], None] | None = None) -> list[Row]:
    """Run every workload under every system, `repeat` times over (the systems interleaved
    within each repetition, so a slow spell of the machine falls on all of them);
    optionally also chunk-boundary capture. `say` hears one line as each step starts (the
    CLI's progress on stderr: a whole bench takes minutes)."""
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    progress = _Progress(say, repeat * len(workloads(model, agent_dir)) * sum(
        1 + (chunk_too and s != "vanilla" and model.chunk_size is not None) for s in systems))
    progress.note("warming up")
    warm_up(model)
    rows: list[Row] = []
    profile: list[tuple[int, int, float]] = []
    for k in range(repeat):
        for name, requests in workloads(model, agent_dir).items():
            for system in systems:
                progress.step(f"run {k + 1} of {repeat}: {name} ({len(requests)} requests), "
                              f"{system}")
                rows.append(dataclasses.replace(run(model, name, requests, system, capacity,
                                                    Capture.EXACT, profile), repeat=k))
                if chunk_too and system != "vanilla" and model.chunk_size is not None:
                    progress.step(f"run {k + 1} of {repeat}: {name}, {system}, "
                                  "chunk-boundary capture")
                    rows.append(dataclasses.replace(run(model, name, requests, system,
                                                        capacity, Capture.CHUNK, []), repeat=k))
    progress.note("done")
    if profile_path is not None:
        write_profile(profile_path, profile)
    return rows


class _Progress:
    """The bench's steps, numbered, with the time spent so far, told to `say`."""

    def __init__(self, say: Callable[[str], None] | None, total: int) -> None:
        self.say, self.total, self.done, self.start = say, total, 0, time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        self.note(f"step {self.done} of {self.total}, {what}")

    def note(self, what: str) -> None:
        if self.say is not None:
            self.say(f"engine-bench: {what} ({time.perf_counter() - self.start:.0f} s)")
