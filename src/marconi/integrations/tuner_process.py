"""The integrations' tuner in a process of its own (docs/integrations.md, "Serving with
vLLM"): a thread beside the engine's scheduling loop holds the GIL that loop needs while
its mirrors replay, so in a deployment the chooser (`Bootstrap` or `Shadows`) and its
mirrors run here, in a child of the engine's process, and only the finished requests'
token ids cross over.

The engine side (`Remote`) hands each request's token list to a writer thread (a deque
append, under a microsecond in the loop: a queue's wake-up of a blocked thread costs tens
of microseconds on a busy machine, so the writer drains the deque every `DRAIN` seconds
instead) that packs it down a pipe; the child answers with
each alpha it adopts, which a reader thread (blocked on the pipe, so holding no GIL)
hands to `on_alpha`. If the child dies, the engine keeps its last alpha and says so once.
The writer's packing holds the GIL for a moment per request: `feed_ns` counts it.

    python -m marconi.integrations.tuner_process READ_FD WRITE_FD   # started by Remote
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

BACKLOG = 4096  # finished requests waiting for the child; past it new ones are dropped
DRAIN = 0.01  # seconds between the writer's looks at the backlog
CHOOSERS = ("Bootstrap", "Shadows")
NICE = 19  # the child's niceness where SCHED_IDLE is not available
STATUS_EVERY = 64  # requests between the child's status messages (besides each alpha)


class Remote:
    """The chooser in a child process, fed from the engine's loop; each alpha it adopts
    goes to `on_alpha` (on the reader thread)."""

    def __init__(self, chooser: str, spec: Any, log: logging.Logger,
                 on_alpha: Callable[[float], None]) -> None:
        if chooser not in CHOOSERS:
            raise ValueError(f"unknown chooser {chooser!r} (known: {', '.join(CHOOSERS)})")
        self.chooser, self.spec, self.log, self.on_alpha = chooser, spec, log, on_alpha
        self.status = "untuned"
        self.report: dict[str, Any] = {}
        self.tuner_ns = 0  # the child's time in its chooser
        self.dropped = 0  # requests the child never saw (its backlog was full)
        self.feed_ns = 0  # the writer thread's packing (it holds the GIL meanwhile)
        self.dead: str | None = None  # why the child is gone, once it is
        self.pid: int | None = None
        self._backlog: deque[tuple[Sequence[int], int]] = deque()
        self._proc: subprocess.Popen[bytes] | None = None
        self._down: Connection | None = None
        self._up: Connection | None = None
        self._writer: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._closing = False
        self._lock = threading.Lock()

    def start(self, system: str, capacity: int, layout: dict[str, Any]) -> None:
        """Start the child with the mirrors' configuration."""
        down_r, down_w = os.pipe()  # engine -> child
        up_r, up_w = os.pipe()  # child -> engine
        src = str(Path(__file__).resolve().parents[2])  # marconi importable in the child
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "marconi.integrations.tuner_process", str(down_r),
             str(up_w)], pass_fds=(down_r, up_w), env=env, stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        self.pid = self._proc.pid
        self._down, self._up = Connection(down_w, readable=False), Connection(up_r,
                                                                               writable=False)
        self._down.send((self.chooser, dataclasses.asdict(self.spec), system, capacity, layout))
        self._writer = threading.Thread(target=self._write, name="marconi-tuner-feed",
                                        daemon=True)
        self._reader = threading.Thread(target=self._read, name="marconi-tuner-alpha",
                                        daemon=True)
        self._writer.start()
        self._reader.start()

    def feed(self, tokens: Sequence[int], n_input: int) -> None:
        """Hand one finished request over: its token ids (a list, or an array), not to be
        changed afterwards. Never blocks: a full backlog drops it."""
        if self.dead is not None:
            return
        if len(self._backlog) < BACKLOG:
            self._backlog.append((tokens, n_input))  # atomic: no lock, no wake-up
        else:
            if not self.dropped:
                self.log.warning("marconi: the tuner process is %d requests behind; requests "
                                 "past that are not tuned on", BACKLOG)
            self.dropped += 1

    def _read(self) -> None:
        up = self._up
        assert up is not None
        try:
            while True:
                kind, value, status, report, tuner_ns = up.recv()
                self.status, self.report, self.tuner_ns = status, report, tuner_ns
                if kind == "alpha":
                    self.on_alpha(float(value))
        except (EOFError, OSError):
            self._died()

    def _write(self) -> None:
        down, backlog = self._down, self._backlog
        assert down is not None
        while True:
            if not backlog:
                if self._closing:
                    break
                time.sleep(DRAIN)
                continue
            tokens, n_input = backlog.popleft()
            start = time.perf_counter_ns()
            packed = tokens.astype(np.int32).tobytes() if isinstance(tokens, np.ndarray) \
                else array("i", tokens).tobytes()
            self.feed_ns += time.perf_counter_ns() - start
            try:
                down.send_bytes(packed + n_input.to_bytes(8, "little"))
            except OSError:
                self._died()
                return
        down.close()

    def _died(self) -> None:
        with self._lock:  # the reader and the writer may both find it gone
            if self.dead is not None:
                return
            if self._closing:  # the end of a run, not a death
                self.dead = "closed"
                return
            code = None if self._proc is None else self._proc.poll()
            self.dead = f"exit code {code}" if code is not None else "its pipe closed"
        self.log.warning("marconi: the tuner process (pid %s) is gone (%s); the engine keeps "
                         "serving at its last alpha", self.pid, self.dead)

    def close(self, timeout: float | None = None) -> None:
        """Let the child finish what it was given, collect its last word, and end it."""
        self._closing = True  # the writer sends what is left, then closes the pipe
        if self._writer is not None and self.dead is None:
            self._writer.join(timeout)
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)


def _chooser(name: str) -> Any:
    from marconi.integrations.choosers import Bootstrap, Shadows

    return Bootstrap() if name == "Bootstrap" else Shadows()


def lowest_priority() -> str:
    """Run this process only on CPU nothing else wants (Linux's SCHED_IDLE), else at the
    highest niceness: on a machine with few cores the engine's processes must never wait
    for the tuner (with `nice` 10 a quick run's TTFT p95 doubled while p50 did not)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        os.nice(NICE)
        return f"nice {NICE}"


def main(argv: list[str]) -> int:
    """The child: build the chooser over its mirrors, observe every request handed down,
    send each adopted alpha (and the chooser's status) up; exit at the end of input."""
    from marconi.core.spec import ModelSpec
    from marconi.systems import get_system

    lowest_priority()  # first: the imports below already take CPU
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine's Ctrl-C ends us through EOF
    down, up = Connection(int(argv[0]), writable=False), Connection(int(argv[1]),
                                                                   readable=False)
    name, spec, system, capacity, layout = down.recv()
    chooser = _chooser(name)
    chooser.build(get_system(system), ModelSpec(**spec), capacity, layout, True)
    spent = seen = 0
    while True:
        try:
            raw = down.recv_bytes()
        except (EOFError, OSError):
            break
        start = time.perf_counter_ns()
        n_input = int.from_bytes(raw[-8:], "little")
        alpha = chooser.observe(np.frombuffer(raw[:-8], dtype=np.int32), n_input)
        spent += time.perf_counter_ns() - start
        seen += 1
        if alpha is not None or seen % STATUS_EVERY == 0:  # (few: the engine reads them
            up.send(("alpha" if alpha is not None else "seen", alpha,  # at its pace)
                     chooser.status(), chooser.report(), spent))
    up.send(("seen", None, chooser.status(), chooser.report(), spent))  # the last word
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
