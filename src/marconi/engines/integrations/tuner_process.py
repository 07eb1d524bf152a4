"""The integrations' tuner in a process of its own (docs/integrations.md, "Serving with
vLLM"): a thread beside the engine's scheduling loop holds the GIL that loop needs while
its mirrors replay, so in a deployment the chooser (`Bootstrap` or `Shadows`) and its
mirrors run here, in a child of the engine's process, and only the finished requests'
token ids cross over.

The engine side (`Remote`) packs each finished request's token ids and writes them down
a pipe from the scheduling loop itself, without ever blocking: what the pipe (widened to
`PIPE_BYTES`) cannot take now waits in a backlog, written at the next request or at the
end. No thread of ours wakes in the engine's process but the reader, blocked on the other
pipe (so holding no GIL), which hands each alpha the child adopts to `on_alpha`. (A writer
thread that looked at a deque every 10 ms took the GIL from the scheduler a hundred
times a second: with it, a quick served run's TTFT p95 was 1.6-2.4x stock's, while the
plugin without a tuner was within stock's spread.) If the child dies, the engine keeps its
last alpha and says so once, and the reader reaps it (no `<defunct>` child left behind).
`feed_ns` counts the packing and writing.

    python -m marconi.engines.integrations.tuner_process READ_FD WRITE_FD   # started by Remote
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

BACKLOG = 4096  # finished requests waiting for the pipe; past it new ones are dropped
PIPE_BYTES = 1 << 20  # the pipe to the child, widened (Linux; its maximum by default)
CHOOSERS = ("Bootstrap", "Shadows")
NICE = 19  # the child's niceness where SCHED_IDLE is not available
STATUS_EVERY = 64  # requests between the child's status messages (besides each alpha)
PICKLE = 5  # the protocol of `pack`
REAP_S = 10.0  # how long the reader waits for a child whose pipe closed to exit


def pack(tokens: Sequence[int], n_input: int) -> bytes:
    """One finished request as it crosses the pipe (`unpack` reads it): a list of ids
    pickled as it is (the child converts it to int32: done in the scheduling loop, the
    conversion made the hand-over 45-50 us a request on the agents, against 31-33 now;
    benchmarks/RESULTS.md), an array as int32."""
    if isinstance(tokens, np.ndarray):
        return pickle.dumps((tokens.astype(np.int32, copy=False), n_input), PICKLE)
    return pickle.dumps((tokens if type(tokens) is list else list(tokens), n_input), PICKLE)


def unpack(raw: bytes) -> tuple[np.ndarray, int]:
    """`pack`'s request: its token ids (int32) and input length."""
    tokens, n_input = pickle.loads(raw)
    return np.asarray(tokens, dtype=np.int32), int(n_input)


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
        self.feed_ns = 0  # packing and writing requests down the pipe (in the loop)
        self.dead: str | None = None  # why the child is gone, once it is
        self.pid: int | None = None
        self._backlog: deque[tuple[Sequence[int], int]] = deque()
        self._pending = memoryview(b"")  # the rest of a message the pipe took in part
        self._proc: subprocess.Popen[bytes] | None = None
        self._down: int | None = None  # the pipe to the child, non-blocking
        self._up: Connection | None = None
        self._reader: threading.Thread | None = None
        self._closing = False
        self._lock = threading.Lock()

    def start(self, system: str, capacity: int, layout: dict[str, Any]) -> None:
        """Start the child with the mirrors' configuration."""
        down_r, down_w = os.pipe()  # engine -> child
        up_r, up_w = os.pipe()  # child -> engine
        src = str(Path(__file__).resolve().parents[3])  # marconi importable in the child
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "marconi.engines.integrations.tuner_process", str(down_r),
             str(up_w)], pass_fds=(down_r, up_w), env=env, stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        self.pid = self._proc.pid
        self._up = Connection(up_r, writable=False)
        self._down = os.dup(down_w)  # ours, once the configuration is sent
        down = Connection(down_w, readable=False)  # the configuration: blocking, once
        down.send((self.chooser, dataclasses.asdict(self.spec), system, capacity, layout))
        down.close()
        widen = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux's
        if widen is not None:
            with contextlib.suppress(OSError):  # past the system's maximum: as it is
                fcntl.fcntl(self._down, widen, PIPE_BYTES)
        os.set_blocking(self._down, False)
        self._reader = threading.Thread(target=self._read, name="marconi-tuner-alpha",
                                        daemon=True)
        self._reader.start()

    def feed(self, tokens: Sequence[int], n_input: int) -> None:
        """Hand one finished request over: its token ids (a list, or an array), not to be
        changed afterwards. Never blocks: what the pipe cannot take waits in the backlog,
        and past `BACKLOG` requests waiting a new one is dropped."""
        if self.dead is not None:
            return
        start = time.perf_counter_ns()
        if len(self._backlog) < BACKLOG:
            self._backlog.append((tokens, n_input))
        else:
            if not self.dropped:
                self.log.warning("marconi: the tuner process is %d requests behind; requests "
                                 "past that are not tuned on", BACKLOG)
            self.dropped += 1
        self._flush()
        self.feed_ns += time.perf_counter_ns() - start

    def _flush(self) -> None:
        """Write down the pipe what it takes now, in order: the rest of a message begun,
        then the backlog's requests, each framed as the child's `recv_bytes` reads it."""
        fd, backlog = self._down, self._backlog
        if fd is None:
            return
        while self._pending or backlog:
            if not self._pending:
                packed = pack(*backlog.popleft())
                self._pending = memoryview(struct.pack("!i", len(packed)) + packed)
            try:
                sent = os.write(fd, self._pending)
            except BlockingIOError:
                return  # full: the rest at the next request
            except OSError:  # the child is gone
                self._down = None
                os.close(fd)
                self._died()
                return
            self._pending = self._pending[sent:]

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
            self._reap()
            self._died()

    def _reap(self) -> None:
        """Collect the child, whose end of the pipe closed as it exited: unwaited for, it
        would stay `<defunct>` under the engine's process until `close`. On the reader
        thread, which may wait (the scheduling loop never does)."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(REAP_S)

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
        self._closing = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._down is not None and (self._pending or self._backlog):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break  # the child is not reading: what is left is not tuned on
            select.select([], [self._down], [], left)  # what is left, as the child reads
            self._flush()
        if self._down is not None:  # (a child gone while flushing closed it already)
            os.close(self._down)  # its EOF: the child's last word, then it exits
            self._down = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)


def _chooser(name: str) -> Any:
    from marconi.engines.integrations.choosers import Bootstrap, Shadows

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
    try:
        while True:
            try:
                raw = down.recv_bytes()
            except (EOFError, OSError):
                break
            start = time.perf_counter_ns()
            tokens, n_input = unpack(raw)
            alpha = chooser.observe(tokens, n_input)
            spent += time.perf_counter_ns() - start
            seen += 1
            if alpha is not None or seen % STATUS_EVERY == 0:  # (few: the engine reads them
                up.send(("alpha" if alpha is not None else "seen", alpha,  # at its pace)
                         chooser.status(), chooser.report(), spent))
        up.send(("seen", None, chooser.status(), chooser.report(), spent))  # the last word
    except BrokenPipeError:  # the engine exited without closing us (its shutdown): no one
        pass  # is left to hear, and no traceback is owed to its log
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
