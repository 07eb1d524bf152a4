"""What a run's summary must say on stderr (`run_warnings`): refusals above 1%, a policy
that ran out of victims, bounds dropped, shadows sampled, a tuner that never finished,
marconi+ beyond its regret bound.
Each reads a `Summary`, live or read back from a sweep's row (`Summary.from_row`)."""

from __future__ import annotations

from marconi.core.units import format_size
from marconi.sim.summary import Summary

REFUSAL_WARNING = 0.01  # share of commits refused above which a run is flagged


def refusal_warning(summary: Summary) -> str | None:
    """A one-line warning when a run refused more than 1% of its commits: those sequences
    were bypassed (too big for the capacity beside what is pinned), so its hit rates
    describe a cache that stored little of the trace."""
    commits, refused = summary.commits or 0, summary.refused_commits
    if not (commits > 0 and refused > REFUSAL_WARNING * commits):
        return None
    commits, refused = int(commits), int(refused)
    beside = " beside what its running requests held" if summary.served is not None else ""
    return (f"warning: {summary.system} refused {refused} of {commits} commits "
            f"({100 * refused / commits:.1f}%): sequences too big for a "
            f"{_size(summary.capacity)} cache{beside} were not cached")


def policy_warning(summary: Summary) -> str | None:
    """A warning when some commit evicted entries and was refused all the same: the
    eviction policy ran out of victims above the floor it should reach (a policy bug;
    those entries were lost for nothing)."""
    lost = summary.evicted_then_refused or 0
    if not lost > 0:
        return None
    return (f"warning: {summary.system}: {int(lost)} commits evicted entries and were "
            "refused all the same (its eviction ran out of victims: a policy bug)")


def bounds_warning(summary: Summary) -> str | None:
    """A one-line warning when a replay dropped its infinite-cache bounds."""
    at = summary.bounds_dropped_at
    if not at:
        return None
    return (f"warning: {summary.system}: infinite-cache bounds dropped after {int(at):,} "
            "requests (they outgrew --bounds-tokens distinct tokens); no bound or miss "
            "attribution is reported (--no-bounds skips them from the start)")


def sampling_note(summary: Summary) -> str | None:
    """A one-line note when marconi+'s shadows were sampled (a long replay): its choices
    were made on estimates, not on every request."""
    tuning = summary.tuning
    if tuning is None or tuning.sampled_from is None or tuning.sample_rate is None:
        return None
    at, rate = tuning.sampled_from, tuning.sample_rate
    return (f"note: {summary.system}: from request {int(at):,} on, its shadow experts saw "
            f"{float(rate):.1%} of the sessions at {float(rate):.1%} of the capacity (a "
            "sampled miniature of each; --shadow-sample-after none, in a sweep "
            "shadow_sample_after = none, keeps them exact)")


def untuned_warning(summary: Summary) -> str | None:
    """A tuned system whose tuner never finished: it evicted at alpha 0 (recency alone)
    all along, and its alpha is null, never 0.0 as if tuned to zero."""
    if summary.alpha_status != "untuned":
        return None
    tuning = summary.tuning
    if tuning is None or tuning.window is None:
        why = ("the cache never evicted, so its bootstrap window never began (alpha "
               "changed nothing)")
    else:
        n0 = "?" if tuning.n0 is None else tuning.n0
        why = (f"its bootstrap window of {tuning.window} requests, from the first "
               f"eviction at request {n0}, outlasts the trace's {summary.requests} "
               "requests, so it evicted with alpha 0 (recency alone) throughout")
    return (f"warning: {summary.system} never finished tuning alpha: {why}; its alpha "
            "is reported as untuned (null)")


def regret_warning(summary: Summary) -> str | None:
    """A one-line warning when marconi+ trailed its best expert, or `sglang+`'s
    configuration, by more than its switching rule bounds (docs/architecture.md,
    "marconi+'s regret"): what the experts it ran before admitted and evicted cost more
    than the rule allows for. Not for sampled shadows (their totals are estimates)."""
    experts = summary.experts
    if experts is None or experts.sampled:
        return None
    over = experts.over()
    if not over:
        return None
    return f"warning: {summary.system}: {'; '.join(over)}"


def unreserved_warning(summary: Summary) -> str | None:
    """A warning when the serving replay ran requests larger than the cache alone: they
    could not hold their memory beside it, so the server modelled is not the one asked
    for (a real one would refuse them)."""
    served = summary.served
    if served is None or not served.unreserved:
        return None
    return (f"warning: {summary.system}: {served.unreserved} requests need more memory "
            f"than the whole {_size(summary.capacity)} cache to run (their KV and working "
            "state); they ran without holding it, which no server can: raise --capacity")


OVERLOADED = 0.5  # share of requests that waited above which a served run is flagged


def overload_warning(summary: Summary) -> str | None:
    """A warning when most requests of a served run waited to be scheduled: the server
    could not keep up with the trace's arrivals, its running requests held most of the
    memory, and its figures describe a queue as much as the trace's reuse."""
    served = summary.served
    if served is None or not served.waited > OVERLOADED * summary.requests:
        return None
    return (f"warning: {summary.system}: the server was overloaded: {served.waited} of "
            f"{summary.requests} requests waited to be scheduled (TTFT p95 "
            f"{served.ttft_p95:.1f} s from issue), and its running requests held much of "
            "the memory; lower the load (--sps, --mean-gap), or model a faster server "
            "(--flops-rate, --latency-profile)")


def run_warnings(summary: Summary) -> list[str]:
    """Every warning and note `summary` calls for, in a fixed order."""
    found = (refusal_warning(summary), policy_warning(summary), bounds_warning(summary),
             sampling_note(summary), untuned_warning(summary), regret_warning(summary),
             unreserved_warning(summary), overload_warning(summary))
    return [message for message in found if message is not None]


def _size(capacity: int | str) -> str:
    return format_size(capacity) if isinstance(capacity, int) else str(capacity)
