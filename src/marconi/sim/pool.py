"""Sweep worker processes that never outlive the sweep, and stop quietly.

- Ctrl-C reaches every process of the terminal's group: workers ignore SIGINT, so only
  the main process handles it (no worker tracebacks), then `stop` kills them.
- SIGTERM of the main process raises `KeyboardInterrupt` in it (`sigterm_interrupts`),
  so the same cleanup runs.
- SIGKILL of the main process (or of a worker, by `stop`) runs no cleanup at all: each
  worker, and each of the bootstrap tuner's replay processes, watches its parent and, once
  reparented, kills its own children and exits (`core.orphans`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from types import FrameType

from marconi.core.orphans import die_with_parent


def worker_pool(workers: int | None, plugins: Sequence[str] = ()) -> ProcessPoolExecutor:
    """A process pool whose workers load `plugins`, ignore Ctrl-C and die with us."""
    return ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1,
                               initializer=init_worker, initargs=(os.getpid(), tuple(plugins)))


def init_worker(parent: int, plugins: Sequence[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    load_plugins(plugins)
    die_with_parent(parent)


def load_plugins(plugins: Sequence[str]) -> None:
    from marconi.systems import load_plugin

    for plugin in plugins:
        load_plugin(plugin)


def stop(pool: Executor) -> None:
    """Kill every worker now (cells in flight are lost; finished ones are saved)."""
    processes = getattr(pool, "_processes", None) or {}  # CPython keeps them here
    for process in list(processes.values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt (the same clean-up as Ctrl-C; exit status 143)."""


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process ended by this interrupt: 128 + the signal."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block (main thread only), SIGTERM raises `Terminated`, a
    KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
