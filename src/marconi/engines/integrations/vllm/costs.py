"""What the vLLM plugin's hooks cost in the scheduling loop: `now`, the clock they read;
`Clocks`, each hook's time by part into the integration's `Counters`; and `report`, the
line logged every `REPORT_EVERY` finished requests."""

from __future__ import annotations

import time

from marconi.engines.integrations.common import Counters, Integration
from marconi.engines.integrations.vllm.versions import log

REPORT_EVERY = 100  # finished requests between the plugin's cost lines

now = time.perf_counter_ns


class Clocks:
    """What a hook calls with the time it took (ns, read with `now` before the call): the
    loop's ordering cost, and one of its parts: books (the pool's hooks keeping the
    states' books), record (a state cached), choose (an allocation's blocks, the walk for a
    victim's candidates included), past (a finished
    request's KV past its last state). The clock is read first, so that the figure holds
    the hook's work and not the counting (a call into code that is cold in the
    scheduling loop: a microsecond or two, as much as some hooks' work); one function per
    part, as finding the counter by name cost more again."""

    def __init__(self, counters: Counters) -> None:
        def books(spent: int) -> None:
            counters.order_ns += spent
            counters.books_ns += spent

        def record(spent: int) -> None:
            counters.order_ns += spent
            counters.record_ns += spent

        def choose(spent: int) -> None:
            counters.order_ns += spent
            counters.choose_ns += spent

        def past(spent: int) -> None:
            counters.order_ns += spent
            counters.past_ns += spent

        self.books, self.record, self.choose, self.past = books, record, choose, past


def report(integration: Integration) -> None:
    """The cost line: requests finished, the loop's cost per request by part, and the
    alpha (fixed, or the tuner's status)."""
    counters, tuning = integration.counters, integration.tuning
    per = 1e3 * counters.requests
    log.info("marconi: %d requests finished; in the scheduling loop %.0f us/request "
             "(ordering %.0f: books %.0f, states cached %.0f, allocations %.0f, "
             "finished %.0f; hand-over %.0f); alpha %g (%s)", counters.requests,
             (counters.order_ns + counters.feed_ns) / per, counters.order_ns / per,
             counters.books_ns / per, counters.record_ns / per,
             counters.choose_ns / per, counters.past_ns / per,
             counters.feed_ns / per, integration.order.alpha,
             "fixed" if tuning is None else tuning.status())
