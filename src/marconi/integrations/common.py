"""What every integration shares (docs/integrations.md): the one-line error, the version
check, the counters of what it did and cost, and `Tuning`, marconi's bootstrap tuner over
a mirror of the engine's cache, fed finished requests beside the scheduling loop."""

from __future__ import annotations

import importlib.metadata
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class IntegrationError(RuntimeError):
    """The integration cannot run here; the message is one line saying why."""


def check_version(package: str, supported: str, who: str, *, series: bool = False) -> str:
    """The installed `package`'s version, or IntegrationError naming the supported one
    (`series`: any `supported.x` release too)."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise IntegrationError(f"{who}: {package} is not installed (it supports {package} "
                               f"{supported})") from None
    if version != supported and not (series and version.startswith(supported + ".")):
        raise IntegrationError(f"{who} supports {package} {supported}"
                               f"{'.x' if series else ''} only; this environment has {version}")
    return version


@dataclass
class Counters:
    """What the integration did and what it cost in the scheduling loop."""

    walks: int = 0  # eviction walks reordered
    victims: int = 0  # states the walks chose
    order_ns: int = 0  # time spent ordering candidates (in the scheduling loop)
    feed_ns: int = 0  # time spent handing finished requests to the tuner (in the loop)
    tuner_ns: int = 0  # time the mirror and the tuner took (beside the loop)
    requests: int = 0  # finished requests handed over
    orphans: int = 0  # cached KV blocks taken before their turn (no hit could use them)

    def to_json(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


class Order(Protocol):
    """An integration's order: the alpha the engine's walks run at."""

    alpha: float


class Tuning:
    """marconi's bootstrap tuner over a mirror of the engine's cache, fed finished
    requests. `background` (the default): a daemon thread does all of it; else it runs
    in the caller (a reproducible benchmark, never a deployment). The alpha it adopts
    becomes `order.alpha`, the engine's from its next eviction."""

    def __init__(self, order: Order, spec: Any, counters: Counters, *,
                 background: bool = True) -> None:
        self.order, self.spec, self.counters = order, spec, counters
        self.background = background
        self.mirror: Any = None
        self.tuner: Any = None
        self.alpha_adopted: float | None = None
        self.threads: set[int] = set()  # where the tuner's work ran (tests read it)
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[np.ndarray, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.mirror is not None

    def start(self, system: str, capacity: int, **layout: Any) -> None:
        """Build the mirror (`system` with the engine's pools; once, at the first
        request) and, in the background, the thread."""
        from marconi.systems import TunerOptions, get_system

        chosen = get_system(system)
        self.mirror = chosen.cache(self.spec, capacity, **layout)
        self.tuner = chosen.make_tuner(None, TunerOptions(wait=not self.background))
        if self.background:
            self._thread = threading.Thread(target=self._run, name="marconi-tuner",
                                            daemon=True)
            self._thread.start()

    def feed(self, tokens: np.ndarray, n_input: int) -> None:
        if self.background:
            self._queue.put((tokens, n_input))
        else:
            self._serve(tokens, n_input)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._serve(*item)
            except BaseException as err:  # reported by `close`; the engine runs on
                self.error = err
                return

    def _serve(self, tokens: np.ndarray, n_input: int) -> None:
        start = time.perf_counter_ns()
        self.threads.add(threading.get_ident())
        self.mirror.lookup(tokens[:n_input])
        self.mirror.commit(tokens, n_input)
        self.tuner.observe(self.mirror, tokens, n_input)
        if self.tuner.done and self.alpha_adopted is None:
            self.alpha_adopted = float(self.mirror.alpha)
            self.order.alpha = self.alpha_adopted  # the engine's from its next eviction
        self.counters.tuner_ns += time.perf_counter_ns() - start

    def close(self, timeout: float | None = None) -> None:
        """Let the thread finish what it was given (the benchmark's end); its error, if
        it failed, as IntegrationError."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
        if self.error is not None:
            raise IntegrationError(f"marconi's tuner failed: {type(self.error).__name__}: "
                                   f"{self.error}") from self.error


@dataclass
class Integration:
    """What an `install` put in, its order and tuner, and what they did."""

    policy: str
    order: Order
    tuning: Tuning | None
    counters: Counters = field(default_factory=Counters)
    undo: list[Any] = field(default_factory=list)
    loop_thread: int = field(default_factory=threading.get_ident)  # the scheduler's

    def report(self) -> dict[str, Any]:
        tuned = self.tuning.alpha_adopted if self.tuning is not None else None
        off = None if self.tuning is None else self.loop_thread not in self.tuning.threads
        return {"policy": self.policy, "alpha": self.order.alpha,
                "alpha_status": "fixed" if self.tuning is None else
                ("tuned" if tuned is not None else "untuned"),
                "tuner_off_loop": off, **self.counters.to_json()}

    def uninstall(self) -> None:
        """Put the engine's own classes back (tests, benchmarks running both)."""
        for target, key, value in reversed(self.undo):
            if isinstance(target, dict):
                target[key] = value
            else:
                setattr(target, key, value)
        if self.tuning is not None:
            self.tuning.close(timeout=5.0)
