"""A real uvicorn server on a free loopback port, in a thread, and a metrics scraper."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from marconi.engine import HybridModel
from marconi.server import Backend, ServerConfig, build_backend, create_app

START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Served:
    url: str  # http://127.0.0.1:PORT
    backend: Backend
    config: ServerConfig

    def client(self, timeout: float = 60.0) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                      timeout=timeout)

    @property
    def model(self) -> str:
        return self.backend.name


@contextmanager
def serve(hybrid: HybridModel, /, **config: object) -> Iterator[Served]:
    """Start a server with a fresh cache over `hybrid`; stop it on exit."""
    cfg = ServerConfig(**config)  # type: ignore[arg-type]
    backend = build_backend(cfg, hybrid)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(backend, cfg), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", backend, cfg)
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
        sock.close()


def scrape(url: str) -> dict[str, float]:
    """Every sample of `/metrics`, keyed `name` or `name{label=value}`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def wait_for(predicate: object, timeout: float = 15.0, what: str = "condition") -> None:
    """Poll `predicate()` until true (bounded)."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
