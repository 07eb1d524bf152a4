"""Worker processes that never outlive the process that started them.

A pool's worker killed by SIGKILL runs no cleanup, so its own workers (a sweep cell's
bootstrap-tuner replays) would be left running for minutes. Each worker started with
`die_with_parent` watches its parent from a daemon thread and, once reparented, kills
its own children and exits.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

WATCH_S = 0.5  # how often a worker checks that its parent is alive


def die_with_parent(parent: int) -> None:
    """Start the watch in this (worker) process; `parent` is the pid that started it."""
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="watch-parent").start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    for child in multiprocessing.active_children():
        child.kill()
    os._exit(1)
