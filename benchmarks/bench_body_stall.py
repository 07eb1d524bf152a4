"""Does a big request body stall the server? `/health` latency while the worst-shaped
bodies a body limit admits are sent, one at a time, to a real `marconi serve` app.

    .venv/bin/python benchmarks/bench_body_stall.py [--limits 32MiB,64MB] [--poll-ms 20]

The server runs in its own process (the embedded tiny model with a 128K-token context, so
its default body limit is 256 B x 131072 = 32 MiB, and 4M characters of text pass the
character bound and are tokenized); this process sends each body on one connection and
polls `/health` on another every `--poll-ms` while that request is in flight, from the
first byte sent to the answer. One line per shape: the body's size, the status it got and
how long it took, and `/health` p50 / p99 / max over the polls. Each body is sized to
just under the limit (but `long-text`, 4M characters, and `many-long-messages`). Last,
`--stalled` connections stop mid-header or mid-body against a server whose header and
body timeouts are 2 s: how many it closed 4 s later, and `/health` meanwhile.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from common import REPO

CONTEXT = 131072  # tokens: a 128K-context model
MODEL = "marconi-tiny-bamba"


def _fill(head: bytes, item: bytes, tail: bytes, size: int, last: bytes = b"") -> bytes:
    """head + item * k + last + tail, as long as fits in `size` bytes."""
    k = (size - len(head) - len(tail) - len(last)) // len(item)
    return head + item * k + last + tail


def _chat(size: int, item: bytes, last: bytes) -> bytes:
    return _fill(b'{"model": "%s", "messages": [' % MODEL.encode(), item, b"]}", size, last)


def _deep(size: int) -> bytes:
    head = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "x": ' % (
        MODEL.encode())
    depth = (size - len(head) - 1) // 2
    return head + b"[" * depth + b"]" * depth + b"}"


SHAPES: dict[str, Callable[[int], bytes]] = {
    "many-role-only-messages": lambda n: _chat(n, b'{"role":"user"},', b'{"role":"user"}'),
    "many-one-char-messages": lambda n: _chat(n, b'{"role":"user","content":"a"},',
                                              b'{"role":"user","content":"a"}'),
    "many-empty-text-parts": lambda n: _fill(
        b'{"model": "%s", "messages": [{"role": "user", "content": [' % MODEL.encode(),
        b'{"type":"text","text":""},', b"]}]}", n, b'{"type":"text","text":""}'),
    "deep-nesting": lambda n: _deep(n),
    "nested-objects-in-messages": lambda n: _chat(
        n, b'{"role":"user","content":"a","x":' + b'{"a":' * 40 + b"1" + b"}" * 40 + b"},",
        b'{"role":"user"}'),
    "huge-string": lambda n: _fill(
        b'{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL.encode(),
        b"a", b'"}]}', n),
    "huge-escaped-string": lambda n: _fill(
        b'{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL.encode(),
        b"\\u00e9", b'"}]}', n),
    "long-text": lambda n: _fill(  # 4M characters: passes the bound, then tokenized
        b'{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL.encode(),
        b"a ", b'"}]}', 32 * CONTEXT),
    "many-long-messages": lambda n: _chat(  # 4000 messages of 1000 characters
        4000 * 1029, b'{"role":"user","content":"' + b"a " * 500 + b'"},',
        b'{"role":"user"}'),
    "huge-unknown-field": lambda n: _fill(  # a valid chat beside an ignored field: 200
        b'{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], '
        b'"x": "' % MODEL.encode(), b"a", b'"}', n),
    "token-id-prompt": lambda n: _fill(
        b'{"model": "%s", "prompt": [' % MODEL.encode(), b"415,", b"1]}", n),
}

SERVE = """
import sys
import uvicorn
from marconi.engines.hf import tiny_model
from marconi.server import ServerConfig, build_backend, create_app
from marconi.server.app import settle, uvicorn_config
from marconi.server.backend import EMBEDDED_VOCAB

port, limit, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
config = ServerConfig(capacity="64MB", port=port, max_body_size=limit or None,
                      header_timeout=timeout, body_timeout=timeout)
hybrid = tiny_model("bamba", vocab_size=EMBEDDED_VOCAB, max_position_embeddings=CONTEXT)
app = create_app(build_backend(config, hybrid), config)
settle()  # as `marconi serve` does
uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, log_level="warning")).run()
""".replace("CONTEXT", str(CONTEXT))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(limit: str, timeout: float = 10.0) -> Iterator[int]:
    """A server process (`limit` "": the default body limit; `timeout`: its header and
    body timeouts); yields its port."""
    port = _free_port()
    path = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONPATH": path}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), limit, str(timeout)], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "no server"
            try:
                if _get(port, "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    out = response.status, response.read()
    conn.close()
    return out


def send(port: int, body: bytes, poll_s: float) -> tuple[int, str, float, list[float]]:
    """POST `body` while polling /health; (status, error code, seconds, /health latencies)."""
    path = "/v1/completions" if b'"prompt"' in body[:100] else "/v1/chat/completions"
    done, latencies = threading.Event(), []

    def poll() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not done.is_set():
            start = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            latencies.append(time.perf_counter() - start)
            done.wait(poll_s)
        conn.close()

    poller = threading.Thread(target=poll)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start = time.perf_counter()
    poller.start()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = response.read()
    took = time.perf_counter() - start
    done.set()
    poller.join()
    conn.close()
    try:
        code = json.loads(answer).get("error", {}).get("code") or ""
    except ValueError:
        code = ""
    return response.status, code, took, latencies


def stalled(port: int, n: int, timeout: float, poll_s: float) -> str:
    """`n` connections stalled, half mid-header and half mid-body, while /health is
    polled for `timeout` + 2 s; how many the server closed, and the /health figures."""
    socks = []
    for k in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-" if k % 2
                     else b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"model\": ")
        socks.append(sock)
    latencies: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    deadline = time.monotonic() + timeout + 2
    while time.monotonic() < deadline:
        start = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        latencies.append(time.perf_counter() - start)
        time.sleep(poll_s)
    conn.close()
    closed = answered = 0
    for sock in socks:
        sock.setblocking(False)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
            closed += 1
        except BlockingIOError:
            pass
        answered += data.startswith(b"HTTP/1.1 408")
        sock.close()
    return (f"  {n} stalled connections ({n // 2} mid-header, {n - n // 2} mid-body), "
            f"timeouts {timeout:g} s: {closed} closed ({answered} with a 408) after "
            f"{timeout + 2:g} s; /health n={len(latencies)} p50 "
            f"{statistics.median(latencies) * 1000:.1f} ms, p99 {_ms(latencies, 0.99):.1f} ms,"
            f" max {max(latencies) * 1000:.1f} ms")


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="32MiB,64MB",
                        help="body limits to serve with; 32MiB is the default for a 128K "
                             "context (the server is started without --max-body-size)")
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--stalled", type=int, default=300,
                        help="connections to stall (0: skip that part)")
    args = parser.parse_args()
    from marconi.core.units import parse_size

    for limit in args.limits.split(","):
        size = parse_size(limit) - 1024
        with server("" if limit == "32MiB" else limit) as port:
            for warm in (SHAPES["huge-string"](1 << 20), SHAPES["huge-unknown-field"](1 << 20)):
                send(port, warm, args.poll_ms / 1000)  # the parser process, torch's kernels
            how = "default for a 128K context" if limit == "32MiB" else "--max-body-size"
            print(f"limit {limit} ({how}), /health polled every {args.poll_ms:g} ms:",
                  flush=True)
            for name in args.shapes.split(","):
                body = SHAPES[name](size)
                status, code, took, lat = send(port, body, args.poll_ms / 1000)
                print(f"  {name:28s} {len(body) / 2**20:5.1f} MiB -> {status} {code:24s} "
                      f"in {took:5.2f} s; /health n={len(lat):3d} p50 "
                      f"{statistics.median(lat) * 1000:5.1f} ms, p99 {_ms(lat, 0.99):6.1f} ms, "
                      f"max {max(lat) * 1000:6.1f} ms", flush=True)

    if args.stalled:
        with server("", timeout=2.0) as port:
            print("stalled connections (slowloris), /health polled meanwhile:", flush=True)
            print(stalled(port, args.stalled, 2.0, args.poll_ms / 1000), flush=True)


if __name__ == "__main__":
    main()
