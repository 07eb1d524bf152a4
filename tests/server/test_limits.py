"""Clients that hold the server's resources: slow headers, stalled bodies, too many
connections, too many messages; and bodies parsed in the parser process answered as
those parsed inline. Timeouts are short here (0.5 s); what is checked is what the server
does, never how fast."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from marconi.engines.hf import HybridModel
from marconi.server.guard import DRAIN_BYTES
from marconi.server.parsing import INLINE_BODY
from tests.server.harness import Served, logged, post, scrape, serve, wait_for

CHAT = "/v1/chat/completions"
WAIT_S = 20.0  # how long a test waits for the server to act (far past each timeout)


def _addr(server: Served) -> tuple[str, int]:
    netloc = urlsplit(server.url)
    return netloc.hostname or "127.0.0.1", int(netloc.port or 80)


@contextmanager
def _raw(server: Served) -> Iterator[socket.socket]:
    sock = socket.create_connection(_addr(server), timeout=WAIT_S)
    try:
        yield sock
    finally:
        sock.close()


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (socket.timeout if it never does)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _chat(server: Served, messages: list[Any], **extra: Any) -> bytes:
    return json.dumps({"model": server.model, "messages": messages, "max_tokens": 2,
                       **extra}).encode()


class TestHeaderTimeout:
    def test_a_client_stalling_mid_header_is_disconnected(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", header_timeout=0.5) as server, logged() as log:
            with _raw(server) as half, _raw(server) as silent:
                half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
                assert _read_all(half) == b""  # closed, nothing answered
                assert _read_all(silent) == b""  # one that never sent a byte, too
            with _raw(server) as ok:  # a complete request is unaffected
                ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert _read_all(ok).startswith(b"HTTP/1.1 200")
            metrics = scrape(server.url)
        assert metrics["marconi:request_rejected_total{reason=header_timeout}"] == 2
        lines = [r.getMessage() for r in log.records if "--header-timeout" in r.getMessage()]
        assert len(lines) == 2 and "no complete request headers within 0.5 s" in lines[0]
        assert not log.errors

    def test_a_kept_alive_connection_gets_the_timeout_for_its_next_request(
            self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", header_timeout=0.5) as server, \
                _raw(server) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            first = b""
            while not first.endswith(b'{"status":"ok"}'):
                first += sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # the next one stalls
            assert _read_all(sock) == b""


class TestBodyTimeout:
    def test_a_client_stalling_mid_body_gets_408(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", body_timeout=0.5) as server, logged() as log:
            with _raw(server) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                             b'{"model": "')
                answer = _read_all(sock)
            metrics = scrape(server.url)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["code"] == "body_timeout" and "--body-timeout" in error["message"]
        assert metrics["marconi:request_rejected_total{reason=body_timeout}"] == 1
        assert any("answered 408" in r.getMessage() for r in log.records)
        assert not log.errors

    def test_a_body_dripped_slower_than_its_deadline_gets_408(self, model: HybridModel) -> None:
        """A byte every 0.2 s never stalls the 0.5 s body timeout; the whole body's
        deadline (1.5 s) ends it."""
        with serve(model, capacity="16MB", body_timeout=0.5, body_deadline=1.5) as server:
            with _raw(server) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
                stop = threading.Event()

                def drip() -> None:
                    for _ in range(50):  # 10 s at most, past which the test fails anyway
                        if stop.wait(0.2):
                            return
                        with contextlib.suppress(OSError):
                            sock.sendall(b" ")

                dripper = threading.Thread(target=drip)
                dripper.start()
                try:
                    answer = _read_all(sock)
                finally:
                    stop.set()
                    dripper.join()
            metrics = scrape(server.url)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        error = json.loads(body)["error"]
        assert error["code"] == "body_timeout" and "--body-deadline" in error["message"]
        assert metrics["marconi:request_rejected_total{reason=body_timeout}"] == 1

    def test_a_body_declared_too_large_that_stalls_is_closed(self, model: HybridModel) -> None:
        """The 413's drain of the rest of the body is timed too."""
        with serve(model, capacity="16MB", body_timeout=0.5, max_body_size="1MB") as server, \
                _raw(server) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 2000000\r\n\r\n{")
            head = _read_all(sock).partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()

    @pytest.mark.parametrize("first", [b"", b"{"], ids=["header-only", "one-byte"])
    def test_a_chunk_declared_past_the_limit_is_refused_up_front(
            self, model: HybridModel, first: bytes) -> None:
        """A chunked body whose chunk header alone promises more than --max-body-size, and
        more than is worth draining, gets its 413 (connection closed) at once: nothing waits
        for the bytes, nor for a timeout (set here past the test's own wait, so only the
        refusal can answer)."""
        with serve(model, capacity="16MB", body_timeout=60, body_deadline=120,
                   max_body_size="1MB") as server, _raw(server) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{DRAIN_BYTES + 1:x}\r\n".encode() + first)
            answer = _read_all(sock)
            metrics = scrape(server.url)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), \
            answer[:300]
        assert json.loads(body)["error"]["code"] == "body_too_large"
        assert metrics["marconi:request_rejected_total{reason=body_too_large}"] == 1

    def test_chunks_within_the_limit_are_served(self, model: HybridModel) -> None:
        """The up-front check counts what is promised, not what was sent twice: a body in
        several chunks, each announced before its bytes, under the limit, is answered."""
        with serve(model, capacity="16MB", max_body_size="1MB") as server, \
                _raw(server) as sock:
            payload = _chat(server, [{"role": "user", "content": "hi " * 2000}])
            parts = [payload[i:i + 4000] for i in range(0, len(payload), 4000)]
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in parts:
                sock.sendall(f"{len(part):x}\r\n".encode())
                sock.sendall(part + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]

    def test_a_stream_outlasting_the_body_timeout_is_not_cut(self, model: HybridModel) -> None:
        """Once the body is in, `receive` only waits for a disconnect: it is not timed
        (a streaming response listens on it for as long as it streams)."""
        with serve(model, capacity="16MB", body_timeout=0.05) as server:
            stream = server.client().chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": "hi"}],
                max_tokens=200, stream=True)
            chunks = list(stream)
            metrics = scrape(server.url)
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        assert "marconi:request_rejected_total{reason=body_timeout}" not in metrics


class TestUnreadBody:
    """A body dripped into a route that reads none is answered, then the connection is
    closed: kept open, a drip faster than the keep-alive timeout would hold it forever."""

    @pytest.mark.parametrize("head", [
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"186a0\r\n",
        b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
    ], ids=["health", "models", "metrics-chunked", "not-found", "post-health"])
    def test_the_connection_closes_after_the_answer(self, server: Served,
                                                    head: bytes) -> None:
        with _raw(server) as sock:
            sock.sendall(head + b"x")
            sock.settimeout(3.0)  # the keep-alive timeout is 5 s: a drip every 0.3 s beats it
            with _dripping(sock, every=0.3):
                answer = _read_all(sock)  # socket.timeout if the connection is held open
        assert answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 404", b"HTTP/1.1 405")), answer

    def test_a_body_sent_whole_keeps_the_connection(self, server: Served) -> None:
        with _raw(server) as sock:
            for _ in range(2):  # the same connection answers twice
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
                             b"{}")
                answer = b""
                while not answer.endswith(b'{"status":"ok"}'):
                    answer += sock.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200")


@contextmanager
def _dripping(sock: socket.socket, every: float) -> Iterator[None]:
    """A byte sent every `every` seconds while inside (errors once it is closed ignored)."""
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(every):
            with contextlib.suppress(OSError):
                sock.sendall(b"x")

    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        yield
    finally:
        stop.set()
        dripper.join()


class TestHalfClose:
    def test_a_client_that_half_closes_after_its_request_gets_its_answer(
            self, model: HybridModel) -> None:
        """An HTTP/1.0 client (or `nc -N`) shuts its sending side once the request is out;
        that is not a disconnect."""
        with serve(model, capacity="16MB") as server:
            body = json.dumps({"model": server.model, "prompt": "hello there",
                               "max_tokens": 2}).encode()
            with _raw(server) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.0\r\n"
                             b"Content-Type: application/json\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                             + body)
                sock.shutdown(socket.SHUT_WR)
                answer = _read_all(sock)
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), answer[:200]
        assert json.loads(payload)["choices"][0]["text"] is not None


class TestConnectionBound:
    def test_a_connection_past_the_bound_gets_503(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", max_connections=2, header_timeout=60) as server:
            with _raw(server), _raw(server):  # two idle connections hold the bound
                wait_for(lambda: _get(server, "/v1/models")[0] == 503, WAIT_S, "a 503")
                status, headers, body = _get(server, "/v1/models")
            assert headers.get("connection") == "close" and headers.get("retry-after") == "1"
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            wait_for(lambda: _get(server, "/v1/models")[0] == 200, WAIT_S, "the bound to free")
            metrics = scrape(server.url)
        assert status == 503
        assert metrics["marconi:request_rejected_total{reason=too_many_connections}"] >= 1

    def test_the_liveness_probe_is_answered_past_the_bound(self, model: HybridModel) -> None:
        """A flood of connections must not make `/health` say 503: an orchestrator would
        restart a server that is alive."""
        with serve(model, capacity="16MB", max_connections=2, header_timeout=60) as server, \
                _raw(server), _raw(server), _raw(server):
            wait_for(lambda: _get(server, "/v1/models")[0] == 503, WAIT_S, "a 503")
            health = [_get(server, "/health") for _ in range(3)]
        assert [status for status, _, _ in health] == [200, 200, 200]
        assert all(json.loads(body).get("status") == "ok" for _, _, body in health), health


def _get(server: Served, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*_addr(server), timeout=WAIT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        conn.close()


class TestChatBounds:
    @pytest.mark.parametrize("padding", [0, INLINE_BODY], ids=["inline", "parser-process"])
    def test_too_many_messages_or_parts_get_400(self, model: HybridModel,
                                                padding: int) -> None:
        with serve(model, capacity="16MB", max_messages=3, max_content_parts=2) as server:
            pad = {"padding": "x" * padding}  # an unknown field: ignored, but read
            four = [{"role": "user", "content": "hi"}] * 4
            too_many = post(server.url, CHAT, _chat(server, four, **pad))
            parts = [{"type": "text", "text": "a"}] * 3
            too_many_parts = post(server.url, CHAT, _chat(
                server, [{"role": "user", "content": parts}], **pad))
            fits = post(server.url, CHAT, _chat(server, four[:3], **pad))
        assert too_many[0] == 400 and too_many[1]["error"]["param"] == "messages"
        assert too_many[1]["error"]["message"] == (
            "messages: 4 messages; this server takes at most 3 (--max-messages)")
        assert too_many_parts[0] == 400 and too_many_parts[1]["error"]["message"] == (
            "messages: 3 content parts in all; this server takes at most 2 "
            "(--max-content-parts)")
        assert fits[0] == 200


class TestParserProcess:
    """Bodies over INLINE_BODY are parsed in the parser process: same answers."""

    def test_big_bodies_are_answered_as_small_ones(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", max_tokens=2) as server, logged() as log:
            pad = "x" * INLINE_BODY
            messages = [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hi "},
                                                     {"type": "text", "text": "there"}]}]
            answers = {
                "ok": post(server.url, CHAT, _chat(server, messages, padding=pad)),
                "small": post(server.url, CHAT, _chat(server, messages)),
                "role": post(server.url, CHAT, _chat(
                    server, [{"role": "tool", "content": "x"}], padding=pad)),
                "surrogate": post(server.url, CHAT, _chat(
                    server, [{"role": "user", "content": "a\ud800"}], padding=pad)),
                "json": post(server.url, CHAT, b'{"model": "' + pad.encode() + b'", '),
                "model": post(server.url, CHAT, json.dumps(
                    {"model": "nope", "messages": messages, "padding": pad})),
                "long": post(server.url, CHAT, _chat(
                    server, [{"role": "user", "content": "word " * 30000}])),
                "completion": post(server.url, "/v1/completions", json.dumps(
                    {"model": server.model, "prompt": "hi", "padding": pad})),
            }
        status = {k: v[0] for k, v in answers.items()}
        assert status == {"ok": 200, "small": 200, "role": 400, "surrogate": 400, "json": 400,
                          "model": 404, "long": 400, "completion": 200}
        ok, small = answers["ok"][1], answers["small"][1]
        assert ok["choices"][0]["message"] == small["choices"][0]["message"]
        assert ok["usage"]["prompt_tokens"] == small["usage"]["prompt_tokens"]
        errors = {k: v[1]["error"] for k, v in answers.items() if v[0] >= 400}
        assert errors["role"]["param"] == "messages.0.role"
        assert "lone surrogate" in errors["surrogate"]["message"]
        assert errors["json"]["message"].startswith("request body is not valid JSON")
        assert errors["model"]["code"] == "model_not_found"
        assert errors["long"]["code"] == "context_length_exceeded"
        assert not log.errors

    def test_a_parser_process_that_died_is_replaced(self, model: HybridModel) -> None:
        with serve(model, capacity="16MB", max_tokens=2) as server:
            body = _chat(server, [{"role": "user", "content": "hi"}], padding="x" * INLINE_BODY)
            assert post(server.url, CHAT, body)[0] == 200
            process = server.app.state.parser._proc
            process.kill()  # as the kernel's OOM killer would
            process.wait()
            assert post(server.url, CHAT, body)[0] == 200
            assert server.app.state.parser._proc is not process
