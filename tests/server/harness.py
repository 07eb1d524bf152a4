"""A real uvicorn server on a free loopback port, in a thread; a metrics scraper, a JSON
poster and a log collector."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from marconi.engines.hf import HybridModel
from marconi.server import Backend, ServerConfig, build_backend, create_app
from marconi.server.app import uvicorn_config

START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Served:
    url: str  # http://127.0.0.1:PORT
    backend: Backend
    config: ServerConfig
    app: FastAPI

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
    app = create_app(backend, cfg)
    with run_app(app) as url:
        yield Served(url, backend, cfg, app)


@contextmanager
def run_app(app: FastAPI) -> Iterator[str]:
    """Run `app` under uvicorn on a free loopback port, in a thread; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
        sock.close()


class Logged(logging.Handler):
    """Collects what the server logs (uvicorn's loggers do not reach pytest's caplog)."""

    NAMES = ("uvicorn", "uvicorn.error", "uvicorn.access", "marconi.server")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def errors(self) -> list[str]:
        """Records at ERROR or above, or carrying a traceback."""
        return [r.getMessage() for r in self.records
                if r.levelno >= logging.ERROR or r.exc_info]


@contextmanager
def logged() -> Iterator[Logged]:
    """Collect the server's log records; enter it after `serve` (uvicorn's config replaces
    the handlers of its loggers when a server is built)."""
    handler = Logged()
    loggers = [logging.getLogger(name) for name in Logged.NAMES]
    ours, level = logging.getLogger("marconi.server"), logging.getLogger("marconi.server").level
    ours.setLevel(logging.INFO)  # as `marconi serve` sets it
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        ours.setLevel(level)
        for logger in loggers:
            logger.removeHandler(handler)


def post(url: str, path: str, body: bytes | str,
         timeout: float = 30) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST a JSON body with urllib: status, parsed JSON answer, headers."""
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(f"{url}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


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
