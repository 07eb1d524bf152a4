"""The concurrent schedule both workers run (standard library only).

The same timeline as marconi's own concurrent replay (`marconi.sim.concurrent`): a request
starts at its arrival, runs for TTFT(n_input, hit) + decode_s x n_output, and what it
commits at its end enters the cache when it finishes; finishes due by an arrival are
applied first (ties: the earlier start first). While it runs it holds what the engine's
scheduler gives a running request (its locks, its request row, its Mamba working slot and
the KV of its prefill), so a later arrival sees those resources taken:

```
arrival ---start(i): match, admit, prefill chunks---> [running: holds locks and slots]
        ---finish(i) at start + TTFT + decode: first token, decode steps, release--->
```

Unlike marconi's replay, an engine admits only what fits: a request the engine refuses
(its pools full, or its running-request cap reached) waits, first in line, for the
earliest running request to finish, and everything behind it waits too (first come,
first served). `start` must leave nothing taken when it refuses (`NoRoom`), as the
engine's scheduler reverts a request it could not add.

TTFT comes from the parent process, which holds marconi's latency model: the worker
writes `ttft I HIT` on stdout and reads the seconds back on stdin (`Parent`).
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO


class NoRoom(Exception):
    """The engine cannot admit the request now (its pools or its running cap are full);
    nothing was taken. `alone`: it could not be admitted even with nothing running."""


@dataclass
class Parent:
    """The parent's latency model over the worker's stdin and stdout."""

    send: TextIO = field(default_factory=lambda: sys.stdout)
    receive: TextIO = field(default_factory=lambda: sys.stdin)

    def ttft(self, index: int, hit: int) -> float:
        self.send.write(f"ttft {index} {hit}\n")
        self.send.flush()
        line = self.receive.readline()
        try:
            seconds = float(line)
        except ValueError:
            raise RuntimeError(f"the parent answered {line.strip()!r} for the TTFT of "
                               f"request {index}, not a number of seconds") from None
        if not seconds >= 0:
            raise RuntimeError(f"the parent gave request {index} a TTFT of {seconds} s")
        return seconds


@dataclass
class Schedule:
    """What the timeline did: requests that waited, the most running at once."""

    waited: int = 0
    wait_seconds: float = 0.0
    max_running: int = 0

    def meta(self) -> dict[str, Any]:
        return {"waited": self.waited, "wait_seconds": round(self.wait_seconds, 6),
                "max_running": self.max_running}


def run_concurrent(order: Sequence[int], arrival: Sequence[float], n_output: Sequence[int],
                   start: Callable[[int], tuple[int, Any]],
                   finish: Callable[[int, Any], None],
                   ttft: Callable[[int, int], float], decode_s: float,
                   max_running: int, started: Callable[[int], None],
                   idle: Callable[[], None] | None = None) -> Schedule:
    """Serve the requests of `order` (arrival order). `start(i)` admits request i and
    runs its prefill, returning (hit, handle) or raising NoRoom; `finish(i, handle)` ends
    it; `started(i)` is called after each start (to record its row); `idle()` whenever
    nothing is running (the engine's integrity checks)."""
    running: list[tuple[float, int, int, Any]] = []  # finish time, start seq, index, handle
    schedule, now = Schedule(), float("-inf")

    def finish_next() -> float:
        done, _, j, handle = heapq.heappop(running)
        finish(j, handle)
        if not running and idle is not None:
            idle()
        return done

    for seq, i in enumerate(order):
        now = max(now, float(arrival[i]))
        while running and running[0][0] <= now:
            finish_next()
        while True:
            if len(running) < max_running:
                try:
                    hit, handle = start(i)
                    break
                except NoRoom:
                    if not running:
                        raise
            now = max(now, finish_next())  # wait for the earliest to finish
        if now > arrival[i]:
            schedule.waited += 1
            schedule.wait_seconds += now - float(arrival[i])
        end = now + ttft(i, hit) + decode_s * int(n_output[i])
        heapq.heappush(running, (end, seq, i, handle))
        schedule.max_running = max(schedule.max_running, len(running))
        started(i)
    while running:
        finish_next()
    return schedule
