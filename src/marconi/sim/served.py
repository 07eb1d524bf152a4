"""A served run checked request by request against replays of the same requests
(`benchmarks/bench_serve.py`; docs/architecture.md, "Replay protocols").

A real server's run gives, per request, the prompt and output it was sent and answered,
when it was sent, when its first token and its last came, and the tokens the server said
it took from its prefix cache. Two readings replay those requests at the server's pool and
block size and compare each request's hit with the served one:

- **server timeline**: the run's own times drive the replay. A request is looked up when
  the server scheduled it (reconstructed: first come, first served, once fewer than the
  server's `--max-num-seqs` run; a request runs from its schedule to its last token), its
  prompt's blocks are cached once its first token came, and it is committed when it
  finished. What is left is the cache's own fidelity.
- **latency model**: the requests are issued when the run sent them, and the serving
  replay models the rest (when each is scheduled, how long its prefill and decode take)
  with a latency profile fitted to the stock server's own TTFTs and its decode step.

Each is replayed through our emulation of vLLM's cache (`vllm-2026`, in process) and
through vLLM's own cache classes (`vllm-0.32`, in its environment).
"""

from __future__ import annotations

import csv
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marconi.core.serving import Visibility, replay_timeline
from marconi.core.serving_native import replay_serving
from marconi.core.spec import ModelSpec
from marconi.sim.result import SimConfig
from marconi.systems import get_system
from marconi.workload.types import Request, Trace

EMULATION = "vllm-2026"  # our in-process emulation of vLLM's cache
ENGINE = "vllm-0.32"  # vLLM's own cache classes, in its environment


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One request a server answered: what it was sent and answered, its timeline
    (seconds on the replay's clock) and the tokens the server took from its cache."""

    session: str
    prompt: np.ndarray
    output: np.ndarray
    sent: float
    first_token: float
    finished: float
    cached: int


def read_served(records: Sequence[Mapping[str, Any]]) -> list[ServedRequest]:
    """The answered requests of a served run's records (`bench_serve --out`'s JSON, one
    server's list), in the order they were sent; ValueError naming a record that lacks its
    timeline (written before the timeline was kept)."""
    out = []
    for k, r in enumerate(records):
        if r.get("error") is not None:
            continue
        missing = [key for key in ("session", "sent", "first_token", "finished", "prompt",
                                   "output", "cached_tokens") if key not in r]
        if missing:
            raise ValueError(f"served record {k} (request {r.get('index')}) lacks "
                             f"{', '.join(missing)}: rerun bench_serve to record them")
        out.append(ServedRequest(
            session=str(r["session"]), prompt=np.asarray(r["prompt"], dtype=np.int32),
            output=np.asarray(r["output"], dtype=np.int32), sent=float(r["sent"]),
            first_token=float(r["first_token"]), finished=float(r["finished"]),
            cached=int(r["cached_tokens"])))
    out.sort(key=lambda s: s.sent)
    return out


def as_requests(served: Sequence[ServedRequest], arrival: np.ndarray) -> list[Request]:
    """`served` as the simulator's requests, each arriving at `arrival[i]`, turns counted
    per session."""
    turn: dict[str, int] = {}
    out = []
    for s, at in zip(served, arrival, strict=True):
        turn[s.session] = turn.get(s.session, -1) + 1
        out.append(Request(session_id=s.session, turn=turn[s.session], arrival=float(at),
                           input_tokens=s.prompt, output_tokens=s.output))
    return out


def scheduled(served: Sequence[ServedRequest], max_num_seqs: int) -> np.ndarray:
    """When the server scheduled each request (first come, first served, once fewer than
    `max_num_seqs` run; a request runs until its last token), never before it was sent nor
    after its first token."""
    running: list[float] = []  # finish times
    out = np.empty(len(served))
    for i, s in enumerate(served):
        now = s.sent
        while running and running[0] <= now:
            heapq.heappop(running)
        if len(running) >= max_num_seqs:
            now = max(now, heapq.heappop(running))
        out[i] = min(now, s.first_token)
        heapq.heappush(running, s.finished)
    return out


def timeline_hits(served: Sequence[ServedRequest], system: str, spec: ModelSpec,
                  capacity: int, max_num_seqs: int) -> np.ndarray:
    """Each request's hit replayed through `system` (in process) on the served timeline."""
    sys_ = get_system(system)
    cache = sys_.cache(spec, capacity, layout=sys_.layout(spec, capacity), as_engine=True,
                       replay=True)
    start = scheduled(served, max_num_seqs)
    hits = np.zeros(len(served), dtype=np.int64)

    def record(i: int, request: Request, hit: int) -> None:
        hits[i] = hit

    replay_timeline(as_requests(served, start), cache, start,
                    np.array([s.first_token for s in served]),
                    np.array([s.finished for s in served]), record,
                    visibility=Visibility(sys_.visibility))
    return hits


def engine_timeline_hits(served: Sequence[ServedRequest], system: str, spec: ModelSpec,
                         capacity: int, max_num_seqs: int,
                         times: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Each request's hit replayed through the engine's own cache code on the served
    timeline (or on `times`, (start, finish) per request: a modelled one): started when
    the server scheduled it (prompt blocks cached at the start, as its worker admits and
    prefills), freed and cached when it finished."""
    from marconi.sim.real_engine import replay

    start, finish = times if times is not None else (
        scheduled(served, max_num_seqs), np.array([s.finished for s in served]))
    order = np.argsort(start, kind="stable")  # the worker serves in arrival order
    if (order != np.arange(len(order))).any():
        hits = engine_timeline_hits([served[i] for i in order], system, spec, capacity,
                                    max_num_seqs, (start[order], finish[order]))
        out = np.empty_like(hits)
        out[order] = hits
        return out
    trace = Trace("served", tuple(as_requests(served, start)))
    config = SimConfig(spec=spec, capacity=capacity, system=system, bounds=False,
                       replay="sequential", retune=False, concurrent=True, decode_s_per_token=0.0)

    def ttft(i: int, hit: int) -> float:
        return float(finish[i] - start[i])

    return replay(trace, config, get_system(system), ttft=ttft).records.hit.copy()


def profile_of(served: Sequence[ServedRequest], path: Path) -> Path:
    """A latency profile (`sim.latency.ProfileLatency`'s CSV) of the server's own TTFTs:
    tokens it prefilled, tokens it had cached, seconds to the first token."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["tokens_to_prefill", "cached_tokens", "seconds"])
        for s in served:
            out.writerow([len(s.prompt) - s.cached, s.cached, s.first_token - s.sent])
    return path


def decode_step(served: Sequence[ServedRequest]) -> float:
    """The server's median seconds per output token after the first."""
    steps = [(s.finished - s.first_token) / (len(s.output) - 1) for s in served
             if len(s.output) > 1]
    return float(np.median(steps)) if steps else 0.0


def model_hits(served: Sequence[ServedRequest], system: str, spec: ModelSpec, capacity: int,
               profile: Path, decode_s: float, max_num_seqs: int,
               chunk_tokens: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Each request's hit under the serving replay of `system` (in process): issued when
    the run sent it (what the client sent when: an open loop), the rest modelled
    (`profile`, `decode_s`, the server's batch limit and step); and the modelled
    timeline, (scheduled, finished) per request, to drive the engine's own code by."""
    from marconi.sim.replay import serving_of

    trace = Trace("served", tuple(as_requests(served, np.array([s.sent for s in served]))))
    config = SimConfig(spec=spec, capacity=capacity, system=system, bounds=False,
                       max_running=max_num_seqs, chunk_tokens=chunk_tokens,
                       decode_s_per_token=decode_s, latency_profile=str(profile))
    sys_ = get_system(system)
    cache = sys_.cache(spec, capacity, layout=config.layout, as_engine=True, replay=True)
    hits = np.zeros(len(trace), dtype=np.int64)

    def record(i: int, request: Request, hit: int) -> None:
        hits[i] = hit

    stats = replay_serving(list(trace.requests), cache, serving_of(config, sys_), record,
                           closed_loop=False)
    return hits, (stats.scheduled, stats.finished)


@dataclass(frozen=True, slots=True)
class Check:
    """One reading of one served run: what was served and what the replay predicted."""

    system: str  # the replayed system, as the line names it
    trace: str
    how: str  # "server timeline" or "latency model"
    served: np.ndarray
    predicted: np.ndarray

    def line(self) -> str:
        served, predicted = int(self.served.sum()), int(self.predicted.sum())
        same = int((self.served == self.predicted).sum())
        ratio = f"{predicted / served:.2f}" if served else "-"
        return (f"predict {self.system} on {self.trace} ({self.how}): served {served} cached "
                f"tokens, predicted {predicted} (ratio {ratio}), requests with the served hit "
                f"{same}/{len(self.served)}")


def replace_system(system: str, block_size: int) -> str:
    """`system` with the served block size among its options."""
    base, _, options = system.partition(":")
    given = [o for o in options.split(",") if o and not o.startswith("block_size=")]
    return f"{base}:" + ",".join([f"block_size={block_size}", *given])

