"""What a load kept and what each filter dropped, so no filter drops data silently.

Readers fill a `LoadStats` and store it in the trace's meta (`meta["load"]`, a plain dict
that survives the disk cache); `describe(trace)` is the one line the CLI prints on stderr
after every load, and `empty_reason` says why a trace that ended up empty is empty.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from marconi.workload.types import Trace

META_KEY = "load"


@dataclass(slots=True, kw_only=True)
class LoadStats:
    """Counts of one load; zero or None where a filter does not apply to the format."""

    unit: str  # what the source holds: conversations, trajectories, requests, ...
    session_unit: str = ""  # what the session filters count ("": the same as `unit`)
    read: int = 0  # units read from the source
    no_call: int = 0  # sessions without a single LLM call (no assistant reply)
    min_turns: int | None = None  # the round filter in force (None: not applied)
    short: int = 0  # sessions dropped by it
    sessions: int | None = None  # the session limit in force (None: none)
    stopped: bool = False  # reading stopped at the session limit (the rest was not read)
    beyond: int = 0  # sessions read but past the limit
    max_input_tokens: int | None = None  # the input length limit in force
    long_requests: int = 0  # requests dropped by it (with their sessions' later turns)
    long_sessions: int = 0  # sessions cut by it
    empty_inputs: int = 0  # requests with nothing before them to prefill (TraceBuilder)

    def as_meta(self) -> dict[str, object]:
        out = asdict(self)
        if not self.empty_inputs:  # (set by TraceBuilder.build, and only when some were)
            del out["empty_inputs"]
        return out

    @classmethod
    def from_meta(cls, meta: dict[str, object]) -> LoadStats | None:
        data = meta.get(META_KEY)
        if not isinstance(data, dict):
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def drops(stats: LoadStats) -> list[str]:
    """One phrase per filter that dropped something, naming its flag."""
    out, unit = [], stats.session_unit or stats.unit
    if stats.no_call:
        out.append(f"{counted(stats.no_call, unit)} without an assistant reply (no LLM call)")
    if stats.short:
        out.append(f"{counted(stats.short, unit)} with fewer than {stats.min_turns} rounds "
                   f"(--min-turns {stats.min_turns})")
    if stats.beyond:
        out.append(f"{counted(stats.beyond, unit)} after the first {stats.sessions} "
                   f"(--sessions {stats.sessions}; 'all' keeps every session)")
    if stats.long_requests:
        within = (f" (the first of them and its session's later turns, in "
                  f"{counted(stats.long_sessions, 'sessions')})" if stats.long_sessions else "")
        out.append(f"{counted(stats.long_requests, 'requests')} over "
                   f"{stats.max_input_tokens:,} input tokens{within} (--max-input-tokens "
                   f"{stats.max_input_tokens}; 'none' keeps them)")
    if stats.empty_inputs:
        out.append(f"{counted(stats.empty_inputs, 'requests')} with an empty input (a conversation "
                   "opening with an empty message: nothing to prefill; the session's later "
                   "requests kept)")
    if stats.stopped:
        out.append(f"everything after the first {stats.sessions} sessions, not read "
                   f"(--sessions {stats.sessions}; 'all' keeps every session)")
    return out


def describe(trace: Trace) -> str:
    """`trace NAME (FORMAT): kept ...; read ...; dropped ...` for stderr."""
    kept = (f"kept {counted(trace.sessions, 'sessions')}, "
            f"{counted(len(trace), 'requests')}, {counted(trace.input_tokens, 'input tokens')}")
    fmt = trace.meta.get("format", "?")
    head = f"trace {trace.name}{'' if fmt == trace.name else f' ({fmt})'}: {kept}"
    stats = LoadStats.from_meta(trace.meta)
    if stats is None:
        return head
    dropped = drops(stats)
    read = f"; read {counted(stats.read, stats.unit)}"
    return head + read + (f"; dropped {'; '.join(dropped)}" if dropped else "; dropped none")


def counted(n: int, plural: str) -> str:
    """`1 session`, `2 sessions`, `1 trajectory`, `1,203 input tokens` (`plural` ends in
    s)."""
    if n != 1:
        return f"{n:,} {plural}"
    return f"1 {plural[:-3]}y" if plural.endswith("ies") else f"1 {plural.removesuffix('s')}"


def empty_reason(trace: Trace) -> str:
    """Why `trace` holds no request, in words a user can act on."""
    stats = LoadStats.from_meta(trace.meta)
    if stats is None:
        return "it holds no request"
    if stats.read == 0:
        return f"it holds no {stats.unit}"
    return f"read {stats.read:,} {stats.unit}, dropped {'; '.join(drops(stats)) or 'none'}"
