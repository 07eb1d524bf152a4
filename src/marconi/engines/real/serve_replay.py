"""A trace replayed against a real OpenAI-compatible server, as its clients would send it
(benchmarks/bench_serve.py, tests/test_serve_vllm.py).

`scaled` fits a trace to the tiny served model: every `stride`-th token of each
request's input and of its output (positions counted from the start of the sequence, so a
prefix of one request stays a prefix of the next), token ids modulo the vocabulary,
outputs cut to `max_output` tokens, requests that would not fit the context dropped
(counted). `replay` sends it through the `openai` client with streaming, greedy, the
output length fixed (`ignore_eos`), several sessions at once: a session's turns go in
order, each when its (time-scaled) arrival has come and the previous turn has finished.
Where the trace's next input extends the previous input and output, the client sends the
previous prompt, the output *the server generated*, and the new part, as a chat client
does; so the prompts, too, are the server's, and two servers are compared on identical
prompts only as long as their outputs agree (`Served.prompt_hash` says). Each `Served`
keeps the served timeline (when the request was sent, its first token came and it
finished, on the replay's clock) and the server's own prompt and cached token counts.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marconi.workload.types import Trace


@dataclass(frozen=True, slots=True)
class Turn:
    """One request as the client sends it."""

    index: int  # in the scaled trace
    session: str
    arrival: float  # seconds after the replay's start
    fresh: np.ndarray  # the prompt's tokens after the previous turn's prompt and output
    extends: bool  # whether the prompt starts with the previous turn's prompt and output
    n_output: int


@dataclass(frozen=True)
class Scaled:
    name: str
    turns: tuple[Turn, ...]
    dropped: int  # requests past the context
    stride: int


def scaled(trace: Trace, *, stride: int = 1, vocab: int, max_output: int = 16,
           max_tokens: int = 4096, requests: int | None = None, span: float = 60.0,
           reserved: int = 3) -> Scaled:
    """The trace fitted to a small served model (module docstring); arrivals scaled so the
    first `requests` span `span` seconds. Token ids land in [reserved, vocab) (the model's
    special tokens stay out of prompts)."""
    previous: dict[str, tuple[Any, int]] = {}  # session -> (its last request, tokens sent)
    turns: list[Turn] = []
    dropped = 0
    kept = list(trace)[:requests] if requests is not None else list(trace)
    last = max((r.arrival for r in kept), default=0.0) or 1.0
    for r in kept:
        ids = np.concatenate([r.input_tokens, r.output_tokens]).astype(np.int64)
        ids = reserved + ids % (vocab - reserved)
        n_in, n_out = r.n_input, r.n_output
        n_output = max(1, min(max_output, len(range(n_in, n_in + n_out)[(-n_in) % stride::
                                                                          stride])))
        prev = previous.get(r.session_id)
        extends = prev is not None and _extends(r, prev[0])
        if extends and prev is not None:  # the new part: past the previous input and output
            upto = prev[0].n_input + prev[0].n_output
            fresh = ids[:n_in][-(-upto // stride) * stride::stride]
            sent = prev[1] + len(fresh)
        else:
            fresh = ids[:n_in][::stride]
            sent = len(fresh)
        if sent + n_output > max_tokens or len(fresh) == 0:
            dropped += 1
            previous.pop(r.session_id, None)
            continue
        turns.append(Turn(index=len(turns), session=r.session_id,
                          arrival=r.arrival / last * span, fresh=fresh, extends=extends,
                          n_output=n_output))
        previous[r.session_id] = (r, sent + n_output)
    return Scaled(trace.name, tuple(turns), dropped, stride)


def _extends(r: Any, before: Any) -> bool:
    """Whether `r`'s input starts with `before`'s input and output (the readers build
    conversation histories that way; checked, not assumed)."""
    upto = before.n_input + before.n_output
    return r.n_input >= upto and bool(np.array_equal(r.input_tokens[:upto],
                                                      before.tokens()))


@dataclass
class Served:
    """What the server did with one turn: when it was sent, answered and finished (the
    served timeline a replay can follow), its prompt's tokens and how many of them the
    server said it took from its prefix cache.

    `cached_tokens` is the server's own per-request figure, the `usage.prompt_tokens_details
    .cached_tokens` of the stream's usage chunk (vLLM 0.32 gives it with
    `--enable-prompt-tokens-details`, 0 included; a response without it is a failed
    request, never a silent 0). `sent`, `first_token` and `finished` are seconds after the
    replay's start, on one clock for every session (`first_token` NaN where no token
    came)."""

    index: int
    prompt_tokens: int  # as the server counted them (`usage.prompt_tokens`)
    cached_tokens: int
    ttft: float  # seconds from sending to the first streamed token
    latency: float  # seconds from sending to the stream's end
    output: list[int]
    prompt_hash: str  # the prompt actually sent (closed loop: depends on earlier outputs)
    error: str | None = None
    prompt: list[int] = field(default_factory=list, repr=False)  # what was sent
    session: str = ""  # the trace's session the turn belongs to
    sent: float = float("nan")  # seconds after the replay's start
    first_token: float = float("nan")  # sent + ttft
    finished: float = float("nan")  # sent + latency


@dataclass
class Replayed:
    served: list[Served] = field(default_factory=list)
    seconds: float = 0.0


async def _session(client: Any, model: str, turns: list[Turn], start: float,
                   limit: asyncio.Semaphore, out: dict[int, Served],
                   progress: Any) -> None:
    prompt: list[int] = []
    for turn in turns:
        delay = start + turn.arrival - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = (prompt if turn.extends else []) + [int(t) for t in turn.fresh]
        async with limit:
            served = await _one(client, model, turn, prompt, start)
        out[turn.index] = served
        progress(served)
        if served.error is not None:
            return  # the session's later prompts would not be the trace's
        prompt = prompt + served.output


async def _one(client: Any, model: str, turn: Turn, prompt: list[int],
               start: float) -> Served:
    """Send one turn; `start` is the replay's start on `time.monotonic`'s clock."""
    sent = time.monotonic()
    first: float | None = None
    output: list[int] = []
    usage = None
    digest = hashlib.blake2b(np.asarray(prompt, dtype=np.int32).tobytes(),
                             digest_size=8).hexdigest()
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=turn.n_output, temperature=0.0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"return_token_ids": True, "ignore_eos": True})
        async for chunk in stream:
            if chunk.choices:
                ids = (chunk.choices[0].model_extra or {}).get("token_ids") or []
                if ids and first is None:
                    first = time.monotonic() - sent
                output += ids
            if chunk.usage is not None:
                usage = chunk.usage
    except Exception as err:  # a failed request is counted and named, never dropped
        latency = time.monotonic() - sent
        return Served(turn.index, len(prompt), 0, float("nan"), latency, output, digest,
                      _named(err), prompt, turn.session, sent - start, float("nan"),
                      sent - start + latency)
    latency = time.monotonic() - sent
    ttft = first if first is not None else float("nan")
    details = getattr(usage, "prompt_tokens_details", None)
    reported = getattr(details, "cached_tokens", None)
    error = None if reported is not None else (
        "the server reported no usage.prompt_tokens_details.cached_tokens (a vLLM server "
        "gives it, 0 included, with --enable-prompt-tokens-details)")
    return Served(turn.index, int(getattr(usage, "prompt_tokens", len(prompt))),
                  int(reported or 0), ttft, latency, output, digest, error, prompt,
                  turn.session, sent - start, sent - start + ttft, sent - start + latency)


def _named(err: BaseException) -> str:
    """The error and what caused it, outermost first (the client's "Connection error."
    alone does not say whether the server refused, reset or never answered)."""
    parts: list[str] = []
    seen: BaseException | None = err
    while seen is not None and len(parts) < 4:
        parts.append(f"{type(seen).__name__}: {seen}".rstrip(": "))
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)


SERVER_KEEP_ALIVE_S = 5.0  # how long uvicorn (vLLM's server) keeps an idle connection open


def async_client(url: str, *, server_keep_alive: float = SERVER_KEEP_ALIVE_S,
                 timeout: float = 600.0) -> Any:
    """The `openai` client the replays send with: no retries (a failed request is counted,
    not resent), and idle pooled connections dropped well before the server drops them.

    With the client's default (5 s, uvicorn's too), a request sent after an idle gap of
    about 5 s can go out on a connection the server is closing at that moment, and fails
    with `APIConnectionError` although the server was well (a request of a quick
    `bench_serve` run failed so, at random). `tests/test_serve_replay.py` shows it."""
    import openai._base_client as base
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    # the HTTP library this openai uses (httpx2 in recent releases, httpx in older ones)
    http = getattr(base, "httpx2", None) or getattr(base, "httpx")  # noqa: B009
    limits = http.Limits(max_connections=1000, max_keepalive_connections=100,
                        keepalive_expiry=server_keep_alive / 4)
    return AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=timeout, max_retries=0,
                       http_client=DefaultAsyncHttpxClient(limits=limits, timeout=timeout))


def replay(url: str, model: str, trace: Scaled, *, concurrency: int = 8,
           progress: Any = None) -> Replayed:
    """Every turn of `trace` against the server at `url` (module docstring)."""
    by_session: dict[str, list[Turn]] = defaultdict(list)
    for turn in trace.turns:
        by_session[turn.session].append(turn)
    out: dict[int, Served] = {}

    async def run() -> None:
        client = async_client(url)
        limit = asyncio.Semaphore(concurrency)
        start = time.monotonic()
        try:
            await asyncio.gather(*(_session(client, model, turns, start, limit, out,
                                            progress or (lambda s: None))
                                   for turns in by_session.values()))
        finally:
            await client.close()

    began = time.monotonic()
    asyncio.run(run())
    return Replayed([out[i] for i in sorted(out)], time.monotonic() - began)


def as_trace(name: str, trace: Scaled, served: list[Served]) -> Trace:
    """What a server was sent and answered, as a marconi trace in arrival order (to replay
    the same requests through the engine's cache classes)."""
    from marconi.workload.types import Request

    turns = {t.index: t for t in trace.turns}
    requests: list[Request] = []
    turn_of: dict[str, int] = {}
    for s in served:
        if s.error is not None:
            continue
        t = turns[s.index]
        turn_of[t.session] = turn_of.get(t.session, -1) + 1
        requests.append(Request(session_id=t.session, turn=turn_of[t.session],
                                arrival=t.arrival,
                                input_tokens=np.asarray(s.prompt, dtype=np.int32),
                                output_tokens=np.asarray(s.output, dtype=np.int32)))
    requests.sort(key=lambda r: r.arrival)
    return Trace(name, tuple(requests))


def percentile(values: list[float], q: float) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.percentile(finite, q)) if finite else float("nan")
