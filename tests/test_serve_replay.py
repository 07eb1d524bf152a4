"""The replays' `openai` client against a real uvicorn server (engines/real/serve_replay.py).

Its own module so that it runs at the dependency floors too (scripts/test-floors.sh): the
client is built from whichever HTTP library the installed openai uses. The served
timeline `replay` records is checked against a small streaming completions endpoint
written here (the real vLLM server's: tests/test_serve_vllm.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import uvicorn

from marconi.engines.real.serve_replay import Scaled, Turn, async_client, replay

KEEP_ALIVE_S = 1  # the test server's idle-connection timeout (vLLM's is 5 s)


FIRST_TOKEN_S = 0.05  # the completions endpoint's wait before its first token
TOKEN_S = 0.01  # and between tokens
SILENT = 99  # a prompt starting with this token gets no prompt_tokens_details


async def _completions(receive, send) -> None:  # type: ignore[no-untyped-def]
    """`/v1/completions`, streamed as vLLM streams it: token ids in each chunk
    (`return_token_ids`), then a usage chunk whose cached tokens are the prompt's length
    less 1, rounded down to 4 (a stand-in for whole blocks)."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    asked = json.loads(body)
    prompt, n = asked["prompt"], asked["max_tokens"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})

    async def event(data: object) -> None:
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"data: {json.dumps(data)}\n\n".encode()})

    head = {"id": "c", "object": "text_completion", "created": 0, "model": asked["model"]}
    await asyncio.sleep(FIRST_TOKEN_S)
    for i in range(n):
        await event({**head, "choices": [{"index": 0, "text": "", "token_ids": [7 + i],
                                          "finish_reason": None if i + 1 < n else "length"}]})
        await asyncio.sleep(TOKEN_S)
    usage: dict[str, object] = {"prompt_tokens": len(prompt), "completion_tokens": n,
                                "total_tokens": len(prompt) + n}
    if prompt[0] != SILENT:
        usage["prompt_tokens_details"] = {"cached_tokens": (len(prompt) - 1) // 4 * 4}
    await event({**head, "choices": [], "usage": usage})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    if scope["path"] == "/v1/completions":
        await _completions(receive, send)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"object": "list", "data": []}'})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port,
                                           log_level="error",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start in 30 s"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_no_request_fails_on_a_connection_the_server_is_closing(url: str) -> None:
    """Requests sent after idle gaps around the server's keep-alive timeout: with pooled
    connections kept as long as the server keeps them (the client's default), some went
    out on a connection the server was closing and failed with `APIConnectionError`
    (measured here: 6, 8 and 9 of these 200 in three runs); the replays' client drops
    idle connections first, so none may fail."""
    clients, rounds = 20, 10

    async def one(k: int) -> list[str]:
        client = async_client(url, server_keep_alive=KEEP_ALIVE_S, timeout=30.0)
        failed: list[str] = []
        try:
            for i in range(rounds):
                try:
                    await client.models.list()
                except Exception as err:  # counted, with its cause
                    failed.append(f"{type(err).__name__} <- {err.__cause__!r}")
                # idle gaps swept over the 6 ms before the server's timeout, 0.1 ms apart
                # (where the failures were measured, the request's own time included)
                await asyncio.sleep(KEEP_ALIVE_S - 0.006 + ((i * clients + k) % 61) * 1e-4)
        finally:
            await client.close()
        return failed

    async def all_of_them() -> list[str]:
        got = await asyncio.gather(*(one(k) for k in range(clients)))
        return [f for failed in got for f in failed]

    failed = asyncio.run(all_of_them())
    assert not failed, f"{len(failed)} of {clients * rounds} requests failed: {failed[:3]}"


def _turn(index: int, session: str, arrival: float, first: int, size: int,
          extends: bool) -> Turn:
    return Turn(index=index, session=session, arrival=arrival,
                fresh=np.arange(first, first + size), extends=extends, n_output=3)


def test_the_replay_keeps_the_served_timeline_and_the_servers_counts(url: str) -> None:
    """Per request: when it was sent, its first token came and it finished (seconds on
    the replay's clock), its session, and the prompt and cached tokens the server
    reported; a session's next turn goes after its previous one finished."""
    trace = Scaled("two sessions", (_turn(0, "a", 0.0, 10, 20, False),
                                    _turn(1, "b", 0.02, 50, 9, False),
                                    _turn(2, "a", 0.03, 30, 5, True)), 0, 1)
    served = replay(url, "m", trace).served
    assert [s.error for s in served] == [None] * 3
    assert [s.session for s in served] == ["a", "b", "a"]
    assert [s.prompt_tokens for s in served] == [20, 9, 20 + 3 + 5]
    assert [s.cached_tokens for s in served] == [16, 8, 24]
    assert [s.output for s in served] == [[7, 8, 9]] * 3
    for s, turn in zip(served, trace.turns, strict=True):
        assert turn.arrival <= s.sent < s.first_token < s.finished
        assert s.first_token - s.sent >= FIRST_TOKEN_S
        assert math.isclose(s.first_token, s.sent + s.ttft, abs_tol=1e-9)
        assert math.isclose(s.finished, s.sent + s.latency, abs_tol=1e-9)
    assert served[2].sent >= served[0].finished  # its prompt carries turn 0's output
    assert served[1].sent < served[0].finished  # the other session did not wait


def test_a_response_without_its_cached_tokens_is_a_failed_request(url: str) -> None:
    """A server that does not report the cached tokens is named, not read as 0 hits."""
    trace = Scaled("silent", (_turn(0, "a", 0.0, SILENT, 8, False),), 0, 1)
    (served,) = replay(url, "m", trace).served
    assert served.error is not None and "prompt_tokens_details.cached_tokens" in served.error
    assert served.cached_tokens == 0 and served.finished >= served.sent
