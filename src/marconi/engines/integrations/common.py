"""What every integration shares (docs/integrations.md): the one-line error, the version
check, the counters of what it did and cost, and `Tuning`: what picks the engine's alpha
beside the scheduling loop from the requests it finished, over mirrors of its cache
(marconi's bootstrap tuner, `Bootstrap`, or marconi+'s shadow experts, `Shadows`: both in
`choosers`), in a thread or a child process (`tuner_process`)."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from marconi.core.policy import check_alpha
from marconi.core.ranked import Ranked
from marconi.engines.integrations.choosers import ENGINE_ALPHAS as ENGINE_ALPHAS  # (re-exported)
from marconi.engines.integrations.choosers import Bootstrap, Shadows

# what an integration installs: Marconi's eviction with its bootstrap tuner, or marconi+'s
# shadow experts choosing among the eviction orders the engine can run; besides these, any
# registered system whose eviction is a declared `Priority` (`declared_priority`: `lfu`,
# `slru`), evaluated in the engine as its own order, with no tuner
POLICIES = ("marconi", "marconi+")


def declared_priority(system: str) -> Any:
    """The `core.priority.Priority` that registered system `system`'s eviction declares (a
    `core.ranked.Ranked`'s), or None (no such system, one whose eviction is written, not
    declared, or the paper's LRU): what a plugin asked for `system` by name evaluates in
    the engine."""
    from marconi.core.spec import PAPER_7B
    from marconi.systems.registry import SYSTEMS

    found = SYSTEMS.get(system)
    if system in POLICIES or found is None or found.engine is not None:
        return None
    # a `Ranked` as such: the paper's LRU (`LRULeaf`, the systems sglang+, vllm+, vanilla
    # and sparse-prefix run) is declared too, and is each engine's own order already
    eviction = found.policies(PAPER_7B, 0.0)[1]
    return eviction.priority if type(eviction) is Ranked else None


def declared_priorities() -> list[str]:
    """Every registered system whose eviction is a declared `Priority`."""
    from marconi.systems.registry import SYSTEMS

    return [name for name in SYSTEMS if declared_priority(name) is not None]


def declared_score(system: str, spec: Any) -> Any:
    """The score `system`'s eviction declares (a `core.priority.Score`, kept as its
    `score`): what a plugin evaluates in the engine, so that the engine and the mirror its
    tuner replays run one declaration, written once in its policy's module."""
    from marconi.systems import get_system

    eviction = get_system(system).policies(spec, 0.0)[1]
    score = getattr(eviction, "score", None)
    if score is None:
        raise IntegrationError(f"system {system}'s eviction ({type(eviction).__name__}) "
                               "declares no score for an engine to evaluate")
    return score

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


MODEL = "MARCONI_MODEL"  # a marconi model (preset or config.json) for the FLOP count
ALPHA = "MARCONI_ALPHA"  # policy marconi: a fixed alpha; unset: bootstrap-tuned


@dataclass(frozen=True)
class Asked:
    """What the environment asks an integration's plugin to install."""

    policy: str
    spec: Any  # a marconi ModelSpec
    alpha: float | None


def check_policy(who: str, policy: str, where: str = "") -> None:
    """IntegrationError unless `policy` is one an integration installs (`where`: the
    variable that named it, for the message)."""
    if policy not in POLICIES and declared_priority(policy) is None:
        allowed = ", ".join((*POLICIES, *declared_priorities()))
        raise IntegrationError(f"{who}: unknown policy {policy!r}{where} (allowed: "
                               f"{allowed}; besides marconi's two, a system whose eviction "
                               "is a declared priority)")


def check_untuned(who: str, policy: str, alpha: float | None) -> Any:
    """The `Priority` `policy` declares (None: marconi's own policies); IntegrationError
    where a declared priority is given an alpha, which it has none of."""
    priority = declared_priority(policy)
    if priority is not None and alpha is not None:
        raise IntegrationError(f"{who}: policy {policy} is a declared priority, which has no "
                               f"alpha to fix (MARCONI_ALPHA={alpha:g})")
    return priority


def asked(who: str, enable: str) -> Asked | None:
    """The policy `enable` names, the model `MARCONI_MODEL` names and the alpha
    `MARCONI_ALPHA` fixes; None when `enable` is unset. IntegrationError (one line naming
    the variable) when a setting is missing or wrong."""
    from marconi.core.spec import model_from

    wanted = os.environ.get(enable)
    if not wanted:
        return None
    check_policy(who, wanted, f" in {enable}")
    if MODEL not in os.environ:
        raise IntegrationError(f"{who}: {enable}={wanted} needs {MODEL} (a marconi model "
                               "name or config path)")
    raw = os.environ.get(ALPHA)
    try:
        alpha = check_alpha(float(raw)) if raw else None
    except ValueError:
        raise IntegrationError(f"{who}: {ALPHA}={raw!r} is not a finite number >= 0") \
            from None
    try:
        spec = model_from(os.environ[MODEL])
    except ValueError as err:
        raise IntegrationError(f"{who}: {MODEL}: {err}") from None
    check_untuned(who, wanted, alpha)
    return Asked(wanted, spec, alpha)


def install_from(engine: str, options: dict[str, Any]) -> Any:
    """`marconi.engines.integrations.<engine>.install` with what a replay worker was given: the
    model as a dict (`spec`), marconi's source folder (`src`, already on the path), this
    module's name (`installer`) and `install`'s keywords."""
    import importlib

    from marconi.core.spec import ModelSpec

    keywords = {k: v for k, v in options.items() if k not in ("spec", "src", "installer")}
    module = importlib.import_module(f"marconi.engines.integrations.{engine}")
    return module.install(ModelSpec(**options["spec"]), **keywords)


@contextmanager
def one_line_exit() -> Iterator[None]:
    """A plugin's refusal stops the process with one line `error: ...` (an engine would log
    a plugin's exception and run stock, silently)."""
    try:
        yield
    except IntegrationError as err:
        raise SystemExit(f"error: {err}") from None


@dataclass
class Counters:
    """What the integration did and what it cost in the scheduling loop."""

    walks: int = 0  # eviction walks reordered
    victims: int = 0  # states the walks chose
    order_ns: int = 0  # time spent ordering candidates (in the scheduling loop)
    # its parts where an integration keeps books (vLLM's: integrations.vllm.costs.Clocks)
    books_ns: int = 0
    record_ns: int = 0
    choose_ns: int = 0
    past_ns: int = 0
    keys: int = 0  # a declared priority's keys the engine's own walk asked for
    feed_ns: int = 0  # time spent handing finished requests to the tuner (in the loop)
    tuner_ns: int = 0  # time the mirror and the tuner took (beside the loop)
    requests: int = 0  # finished requests (each handed to the tuner where there is one)
    orphans: int = 0  # cached KV blocks taken before their turn (no hit could use them)
    checked: int = 0  # choices also made the plain way and found equal (check mode)

    def to_json(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


class Order(Protocol):
    """An integration's order: the alpha the engine's walks run at."""

    alpha: float


class Chooser(Protocol):
    """What picks the engine's alpha from finished requests, beside the scheduling loop:
    marconi's bootstrap tuner (`Bootstrap`) or marconi+'s shadow experts (`Shadows`)."""

    def build(self, system: Any, spec: Any, capacity: int, layout: dict[str, Any],
              wait: bool) -> None:
        """Set up for the engine's pools (`system`: the mirror's, with the engine's layout)."""

    def observe(self, tokens: np.ndarray, n_input: int) -> float | None:
        """One finished request; the alpha to run from now on, or None to keep it."""

    def status(self) -> str:
        """"tuned" once it has chosen, else "untuned"."""

    def report(self) -> dict[str, Any]:
        """What it did, for the integration's report (JSON-ready)."""


class Tuning:
    """A chooser (`Bootstrap`, `Shadows`) over mirrors of the engine's cache, fed finished
    requests. `background` (the default): a daemon thread does all of it; with `process`
    too, a child process does (`tuner_process.Remote`: the engine's loop only hands the
    tokens over, and the mirrors' replays never take the GIL it needs); without
    `background` it runs in the caller (a reproducible benchmark, never a deployment).
    Each alpha it chooses becomes `order.alpha`, the engine's from its next eviction."""

    def __init__(self, order: Order, spec: Any, counters: Counters, *,
                 background: bool = True, chooser: Chooser | None = None,
                 process: bool = False, log: logging.Logger | None = None) -> None:
        self.order, self.spec, self.counters = order, spec, counters
        self.background = background
        self.process = background and process
        self.chooser: Chooser = chooser if chooser is not None else Bootstrap()
        self.log = log if log is not None else logging.getLogger("marconi.engines.integrations")
        self.started = False
        self.alpha_adopted: float | None = None  # the last alpha chosen
        self.threads: set[int] = set()  # where the tuner's work ran (tests read it)
        self.error: BaseException | None = None
        self.remote: Any = None  # the child process, with `process`
        self._queue: queue.Queue[tuple[np.ndarray, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self, system: str, capacity: int, **layout: Any) -> None:
        """Build the mirrors (`system` with the engine's pools; once, at the first
        request): here, in a thread, or in the child process."""
        self.started = True
        if self.process:
            from marconi.engines.integrations.tuner_process import Remote

            self.remote = Remote(type(self.chooser).__name__, self.spec, self.log,
                                 self._adopt)
            self.remote.start(system, capacity, layout)
            return
        from marconi.systems import get_system

        self.chooser.build(get_system(system), self.spec, capacity, layout,
                           not self.background)
        if self.background:
            self._thread = threading.Thread(target=self._run, name="marconi-tuner",
                                            daemon=True)
            self._thread.start()

    def feed(self, tokens: Any, n_input: int) -> None:
        """One finished request's token ids (an array; with `process` also a list, not
        to be changed afterwards) and its input length."""
        if self.remote is not None:
            self.remote.feed(tokens, n_input)
        elif self.background:
            self._queue.put((tokens, n_input))
        else:
            self._serve(tokens, n_input)

    def status(self) -> str:
        """"tuned" once the chooser has chosen, else "untuned"."""
        return self.remote.status if self.remote is not None else self.chooser.status()

    def report(self) -> dict[str, Any]:
        if self.remote is None:
            return self.chooser.report()
        return {**self.remote.report, "tuner_pid": self.remote.pid,
                "tuner_dropped": self.remote.dropped, "tuner_dead": self.remote.dead,
                "tuner_pack_ns": self.remote.feed_ns}

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._serve(*item)
            except BaseException as err:  # reported by `close`; the engine runs on
                self.error = err
                self.log.warning("marconi: the tuner failed (%s: %s); the engine keeps "
                                 "serving at alpha %g", type(err).__name__, err,
                                 self.order.alpha)
                return

    def _serve(self, tokens: np.ndarray, n_input: int) -> None:
        start = time.perf_counter_ns()
        self.threads.add(threading.get_ident())
        alpha = self.chooser.observe(tokens, n_input)
        if alpha is not None:
            self._adopt(alpha)
        self.counters.tuner_ns += time.perf_counter_ns() - start

    def _adopt(self, alpha: float) -> None:
        before, self.alpha_adopted = self.order.alpha, alpha
        self.order.alpha = alpha  # the engine's from its next eviction
        why = self.report().get("alpha_why")  # (where a guard chose it, why)
        self.log.info("marconi: alpha %g adopted (was %g; %s, after %d finished requests)%s",
                      alpha, before, type(self.chooser).__name__.lower(),
                      self.counters.requests, f": {why}" if why else "")

    def close(self, timeout: float | None = None) -> None:
        """Let the thread (or the child) finish what it was given (the benchmark's end);
        its error, if it failed, as IntegrationError."""
        if self.remote is not None:
            self.remote.close(timeout)  # its last messages read
            self.counters.tuner_ns = self.remote.tuner_ns
            return
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
        if self.error is not None:
            raise IntegrationError(f"marconi's tuner failed: {type(self.error).__name__}: "
                                   f"{self.error}") from self.error


def tuning_for(policy: str, order: Order, spec: Any, counters: Counters,
               alpha: float | None, background: bool, process: bool = False,
               log: logging.Logger | None = None) -> Tuning | None:
    """The tuner an integration's `policy` runs beside the engine: none with a fixed
    `alpha` (marconi only), marconi's bootstrap tuner, or marconi+'s shadow experts."""
    if alpha is not None:
        try:
            check_alpha(alpha)
        except ValueError as err:
            raise IntegrationError(f"{policy}: {err}") from None
    if policy == "marconi+":
        if alpha is not None:
            raise IntegrationError("marconi+ chooses its own alpha among its experts; "
                                   "a fixed alpha is for policy marconi")
        return Tuning(order, spec, counters, background=background, chooser=Shadows(),
                      process=process, log=log)
    if alpha is not None:
        return None
    return Tuning(order, spec, counters, background=background, process=process, log=log)


ABSENT = object()  # in an `Integration.undo` entry: the key (or list item) was not there


@dataclass
class Integration:
    """What an `install` put in, its order and tuner, and what they did."""

    policy: str
    order: Order
    tuning: Tuning | None
    counters: Counters = field(default_factory=Counters)
    undo: list[Any] = field(default_factory=list)
    loop_thread: int = field(default_factory=threading.get_ident)  # the scheduler's

    @classmethod
    def of(cls, policy: str, order: Order, spec: Any, alpha: float | None,
           background: bool, process: bool = False, log: logging.Logger | None = None
           ) -> Integration:
        """`order` in the engine and what tunes it under `policy` (`tuning_for`)."""
        counters = Counters()
        return cls(policy=policy, order=order, counters=counters,
                   tuning=tuning_for(policy, order, spec, counters, alpha, background,
                                     process, log))

    def report(self) -> dict[str, Any]:
        tuning = self.tuning
        off = None if tuning is None else self.loop_thread not in tuning.threads
        return {"policy": self.policy, "alpha": self.order.alpha,
                "alpha_status": "fixed" if tuning is None else tuning.status(),
                "tuner_off_loop": off, **self.counters.to_json(),
                **({} if tuning is None else tuning.report())}

    def uninstall(self) -> None:
        """Put the engine's own classes back (tests, benchmarks running both)."""
        for target, key, value in reversed(self.undo):
            if value is ABSENT:  # put in where the engine had nothing
                if isinstance(target, dict):
                    target.pop(key, None)
                elif key in target:
                    target.remove(key)
            elif isinstance(target, dict):
                target[key] = value
            else:
                setattr(target, key, value)
        if self.tuning is not None:
            self.tuning.close(timeout=5.0)


class Installed:
    """The integration an engine's module has installed in this process (`current`; None:
    none), and taking it out again: one per engine module."""

    def __init__(self) -> None:
        self.current: Integration | None = None

    def put(self, done: Integration) -> Integration:
        self.current = done
        return done

    def uninstall(self) -> None:
        """Put the engine's own classes back (tests, benchmarks running both)."""
        if self.current is not None:
            self.current.uninstall()
        self.current = None
