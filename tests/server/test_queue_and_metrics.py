"""The queue (429 with Retry-After), clients that leave (cancelled quietly), and metrics
that account for every request: answered, failed or refused."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from marconi.engines.hf import HybridModel
from marconi.server import service
from tests.server.harness import Served, logged, post, scrape, serve, wait_for

ABORTED = "marconi:request_success_total{finished_reason=abort}"
README = Path(__file__).resolve().parents[2] / "README.md"


def _running(server: Served) -> float:
    return scrape(server.url)["marconi:num_requests_running"]


def _long_running(server: Served, client: openai.OpenAI) -> Any:
    """A streamed chat request of 3,000 tokens, its first content chunk read: it runs until
    its client closes the stream."""
    long = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "go"}],
        max_tokens=3000, stream=True)
    chunks = iter(long)
    while not next(chunks).choices[0].delta.content:
        pass
    return long


class TestQueueAndDisconnect:
    def test_full_queue_gives_429_and_a_gone_client_frees_its_request(
            self, model: HybridModel) -> None:
        with serve(model, capacity="64MB", max_queue=1) as server, logged() as log:
            client = server.client()
            long = _long_running(server, client)
            queued: list[Any] = []
            waiter = threading.Thread(target=lambda: queued.append(client.completions.create(
                model=server.model, prompt="wait", max_tokens=2)))
            waiter.start()
            wait_for(lambda: scrape(server.url)["marconi:num_requests_waiting"] == 1,
                     what="one queued request")
            with pytest.raises(openai.RateLimitError) as err:
                client.completions.create(model=server.model, prompt="full", max_tokens=2)
            assert err.value.status_code == 429
            assert err.value.body["code"] == "queue_full"  # type: ignore[index]
            assert err.value.response.headers["retry-after"] == "1"
            long.close()  # the client goes away mid-stream
            waiter.join(60)
            assert queued and queued[0].usage.completion_tokens == 2
            metrics = scrape(server.url)
        assert metrics[ABORTED] == 1
        assert metrics["marconi:generation_tokens_total"] < 1500  # stopped early
        assert metrics["marconi:request_rejected_total{reason=queue_full}"] == 1
        assert metrics["marconi:num_requests_running"] == 0
        assert log.errors == []

    def test_queued_clients_that_leave_free_their_slots_at_once(
            self, model: HybridModel) -> None:
        """Four queued chat requests whose clients close their sockets leave the queue
        within the handler's poll (POLL_S), while the request before them still runs:
        the next request is queued, not refused with 429."""
        with serve(model, capacity="64MB", max_queue=4) as server, logged() as log:
            client = server.client()
            long = _long_running(server, client)
            where = urlsplit(server.url)
            body = json.dumps({"model": server.model, "max_tokens": 2,
                               "messages": [{"role": "user", "content": "wait"}]})
            socks = [socket.create_connection((where.hostname, where.port), timeout=10)
                     for _ in range(4)]
            for sock in socks:
                sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             f"Content-Type: application/json\r\nContent-Length: "
                             f"{len(body)}\r\n\r\n{body}".encode())
            wait_for(lambda: scrape(server.url)["marconi:num_requests_waiting"] == 4,
                     what="four queued requests")
            for sock in socks:
                sock.close()
            wait_for(lambda: scrape(server.url)["marconi:num_requests_waiting"] == 0,
                     timeout=3.0, what="the queue to empty")
            assert _running(server) == 1  # the long request runs on: it freed nothing
            queued: list[Any] = []
            waiter = threading.Thread(target=lambda: queued.append(client.completions.create(
                model=server.model, prompt="next", max_tokens=2)))
            waiter.start()  # queued behind the long one, not refused
            wait_for(lambda: scrape(server.url)["marconi:num_requests_waiting"] == 1,
                     what="the next request queued")
            long.close()
            waiter.join(60)
            assert queued and queued[0].usage.completion_tokens == 2
            metrics = scrape(server.url)
        assert metrics[ABORTED] == 5  # the four that left waiting, and the long one
        assert not metrics.get("marconi:request_rejected_total{reason=queue_full}")
        assert log.errors == []

    def test_a_waiting_client_that_leaves_is_cancelled_quietly(
            self, model: HybridModel, monkeypatch: pytest.MonkeyPatch) -> None:
        """Non-streaming: the handler notices the client is gone, cancels the request and
        logs one line, not a traceback. It looks at every token: with a poll longer than
        the whole generation, only that check can notice."""
        monkeypatch.setattr(service, "POLL_S", 600.0)
        with serve(model, capacity="64MB") as server, logged() as log:
            body = json.dumps({"model": server.model, "prompt": "go", "max_tokens": 3000})
            where = urlsplit(server.url)
            sock = socket.create_connection((where.hostname, where.port), timeout=10)
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
                         .encode())
            wait_for(lambda: _running(server) == 1, timeout=60, what="the request to run")
            sock.close()
            wait_for(lambda: scrape(server.url).get(ABORTED) == 1, timeout=60,
                     what="the request to stop")
            wait_for(lambda: log.errors or any("disconnected" in r.getMessage()
                                               for r in log.records),
                     timeout=60, what="the handler to notice")
            assert scrape(server.url)["marconi:generation_tokens_total"] < 1500
        assert log.errors == []


    def test_a_streaming_client_that_leaves_is_logged_in_one_line(
            self, model: HybridModel) -> None:
        with serve(model, capacity="64MB") as server, logged() as log:
            stream = server.client().completions.create(
                model=server.model, prompt="go", stream=True, max_tokens=3000)
            next(iter(stream))
            stream.close()  # the client goes away mid-stream
            wait_for(lambda: any("disconnected mid-stream" in r.getMessage()
                                 for r in log.records), timeout=60,
                     what="the stream's log line")
        assert log.errors == []

    def test_a_client_that_leaves_while_sending_its_body_is_a_disconnect(
            self, model: HybridModel) -> None:
        """Counted as `disconnected`, logged in one line: not an internal failure with a
        traceback."""
        with serve(model, capacity="64MB") as server, logged() as log:
            where = urlsplit(server.url)
            for _ in range(3):
                sock = socket.create_connection((where.hostname, where.port), timeout=10)
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/json\r\nContent-Length: 5000\r\n\r\n{\"model")
                sock.close()
            wait_for(lambda: scrape(server.url).get(
                "marconi:request_failure_total{reason=disconnected}") == 3, timeout=60,
                what="three disconnects counted")
            metrics = scrape(server.url)
        assert not metrics.get("marconi:request_failure_total{reason=internal}")
        assert log.errors == []
        said = [r for r in log.records if "while sending its body" in r.getMessage()]
        assert len(said) == 3 and all(r.exc_info is None for r in said)


class TestMetricsAddUp:
    def test_every_request_is_counted_once(self, model: HybridModel) -> None:
        with serve(model, capacity="64MB", max_tokens=2) as server:
            client, name = server.client(), server.model
            client.completions.create(model=name, prompt="one")
            client.chat.completions.create(model=name, messages=[{"role": "user",
                                                                  "content": "two"}])
            stream = client.completions.create(model=name, prompt="three", stream=True,
                                               max_tokens=3000)
            next(iter(stream))
            stream.close()  # aborted
            refused = [{"model": name, "prompt": "x", "echo": True},  # 400
                       {"model": "gpt-9", "prompt": "x"},  # 404
                       {"model": name, "prompt": "a " * 5000},  # 400, context length
                       {"model": name, "prompt": "a" * 2**21}]  # 413
            statuses = [post(server.url, "/v1/completions", json.dumps(b))[0] for b in refused]
            unparseable = [b'{"model": "\xff"}', b"[" * 50_000 + b"]" * 50_000]  # 400s
            statuses += [post(server.url, "/v1/completions", b)[0] for b in unparseable]
            statuses.append(post(server.url, "/v1/nope", "{}")[0])  # no such route
            assert statuses == [400, 404, 400, 413, 400, 400, 404]
            wait_for(lambda: scrape(server.url).get(ABORTED) == 1, what="the abort")
            metrics = scrape(server.url)
        counted = {k: v for k, v in metrics.items() if v and k.startswith((
            "marconi:request_success_total", "marconi:request_failure_total",
            "marconi:request_rejected_total"))}
        assert counted == {
            "marconi:request_success_total{finished_reason=length}": 2, ABORTED: 1,
            "marconi:request_rejected_total{reason=invalid_request}": 3,
            "marconi:request_rejected_total{reason=model_not_found}": 1,
            "marconi:request_rejected_total{reason=context_length_exceeded}": 1,
            "marconi:request_rejected_total{reason=body_too_large}": 1,
            "marconi:request_rejected_total{reason=not_found}": 1}
        row = next(line for line in README.read_text().splitlines()
                   if line.startswith("| `marconi:request_rejected_total{reason}`"))
        for key in counted:  # the README's metrics table lists every reason refused for
            if key.startswith("marconi:request_rejected_total"):
                reason = key.partition("reason=")[2].rstrip("}")
                assert f"`{reason}`" in row, reason


def test_a_crashed_generation_is_answered_logged_and_counted(model: HybridModel) -> None:
    """A bug inside the engine: the client gets a 500 in OpenAI's shape, the operator a
    logged traceback, and the metrics an internal failure."""
    with serve(model, capacity="16MB", max_tokens=2) as server, logged() as log:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug in the engine")

        server.backend.engine.generate = broken  # type: ignore[method-assign]
        status, answer, _ = post(server.url, "/v1/completions",
                                 json.dumps({"model": server.model, "prompt": "x"}))
        metrics = scrape(server.url)
    assert status == 500 and set(answer["error"]) == {"message", "type", "param", "code"}
    assert metrics["marconi:request_failure_total{reason=internal}"] == 1
    crashes = [r for r in log.records if r.exc_info and "generation failed" in r.getMessage()]
    assert len(crashes) == 1 and "a bug in the engine" in str(crashes[0].exc_info[1])


def test_a_stopped_server_leaves_no_tuner_thread(model: HybridModel) -> None:
    """The tuner's replays run on a thread of the server's own; the app's end stops it (a
    process that serves many apps, a test suite, kept one idle thread per server)."""
    before = set(threading.enumerate())
    with serve(model, capacity="256MB", max_tokens=4, system="marconi") as served:
        served.client().completions.create(model=served.model, prompt="hello there",
                                           max_tokens=2)
        executor = served.backend.tuner_thread
        assert executor is not None
        executor.submit(int).result(timeout=30)  # its thread exists now
        ours = [t for t in set(threading.enumerate()) - before
                if t.name.startswith("marconi-tuner")]
        assert ours
    for thread in ours:
        thread.join(timeout=30)
        assert not thread.is_alive(), f"{thread.name} outlived its server"
    with pytest.raises(RuntimeError):
        executor.submit(int)
