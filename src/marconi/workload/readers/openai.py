"""OpenAI chat request logs -> a trace (format `openai`); what a line may hold, and how
sessions, replies and arrivals are found: `openai_log.py`.

Requests are put in time order, grouped into sessions, filtered like every format
(`--min-turns`, default 1; `--sessions`; `--max-input-tokens`, which drops a request and
its session's later turns), rendered through the chat template in one batch, and laid out
so that a request whose prompt and reply are a prefix of a later one's in the same session
is a view into that one's buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from marconi.workload.buffers import Built, TraceBuilder
from marconi.workload.errors import TraceError
from marconi.workload.options import TraceOptions
from marconi.workload.pseudo import pseudo_tokens
from marconi.workload.readers.openai_log import Row, digests, parse
from marconi.workload.report import META_KEY, LoadStats
from marconi.workload.templates import Chat, Rendered, message_text, template_for

Session = list[Row]


def read(source: str | Path, options: TraceOptions) -> Built:
    path = Path(source)
    rows = _ordered(parse(path, options), path)
    stats = LoadStats(unit="requests", session_unit="sessions", read=len(rows),
                      max_input_tokens=options.max_input_tokens)
    groups = _by_field(rows) if options.session_field else _by_prefix(rows)
    chosen = _select(groups, options, stats)
    template = template_for(options.tokenizer)
    chats = [Chat(row.messages, _reply(session, k)) for _, session in chosen
             for k, row in enumerate(session)]
    rendered = iter(template.render(chats))
    builder, t0 = TraceBuilder(), min((r.time for r in rows if r.time is not None), default=0)
    for index, (sid, session) in enumerate(chosen):
        items = [_with_output(next(rendered), row, options) for row in session]
        added = _add_session(builder, sid, items, _arrivals(session, index, options, t0),
                             options.max_input_tokens)
        stats.long_requests += len(session) - added
        stats.long_sessions += added < len(session)
    meta: dict[str, object] = {"format": "openai", "source": str(path),
                               "template": template.name, META_KEY: stats.as_meta()}
    return builder.build(path.name, meta)


def _ordered(rows: list[Row], path: Path) -> list[Row]:
    """Rows by time when every row has one, in file order when none has."""
    timed = [r.time is not None for r in rows]
    if all(timed):
        return sorted(rows, key=lambda r: r.time or 0.0)
    if any(timed):
        line = rows[timed.index(False)].line
        raise TraceError("missing timestamp (other lines have one)", path=path, line=line,
                         field="timestamp")
    return rows


def _by_field(rows: list[Row]) -> dict[str, Session]:
    groups: dict[str, Session] = {}
    for row in rows:
        groups.setdefault(str(row.key), []).append(row)
    return groups


def _by_prefix(rows: list[Row]) -> dict[str, Session]:
    """A request whose messages extend (or repeat) an earlier request's messages, with or
    without that request's reply, continues its session; else it starts one."""
    known: dict[bytes, str] = {}
    groups: dict[str, Session] = {}
    for row in rows:
        n = len(row.messages)
        replied = [] if row.reply is None else [{"role": "assistant", "content": row.reply}]
        chain = digests([*row.messages, *replied])
        sid = next((known[d] for d in reversed(chain[:n]) if d in known), f"line{row.line}")
        groups.setdefault(sid, []).append(row)
        known.update(dict.fromkeys(chain[n - 1:], sid))
    return groups


def _select(groups: dict[str, Session], options: TraceOptions,
            stats: LoadStats) -> list[tuple[str, Session]]:
    stats.min_turns, stats.sessions = options.min_turns_or(1), options.sessions
    kept: list[tuple[str, Session]] = []
    for sid, session in groups.items():
        if len(session) < stats.min_turns:
            stats.short += 1
        elif options.sessions is not None and len(kept) == options.sessions:
            stats.beyond += 1
        else:
            kept.append((sid, session))
    return kept


def _reply(session: Session, k: int) -> str | None:
    """The logged reply, else the assistant message the next request carries after
    request k's messages."""
    row = session[k]
    if row.reply is not None or k + 1 == len(session):
        return row.reply
    n, following = len(row.messages), session[k + 1].messages
    if len(following) > n and following[n].get("role") == "assistant" \
            and digests(following[:n])[-1] == digests(row.messages)[-1]:
        return message_text(following[n])  # its text, and its tool calls if any
    return None


def _with_output(rendered: Rendered, row: Row, options: TraceOptions) -> Rendered:
    """Pseudo-random reply ids of the logged count when the reply's text is unknown."""
    if rendered.reply.shape[0] or not row.n_reply:
        return rendered
    ids = pseudo_tokens(row.line, row.n_reply, vocab=options.vocab_size, salt=options.seed)
    return rendered._replace(reply=ids)


def _arrivals(session: Session, index: int, options: TraceOptions, t0: float) -> list[float]:
    """Logged times from the earliest request, or the typing model from i / sps."""
    if session[0].time is not None:
        return [(r.time or 0.0) - t0 for r in session]
    times = [index / options.sps]
    for row in session[1:]:
        users = [m for m in row.messages if m.get("role") == "user"]
        words = len(str(users[-1]["content"]).split()) if users else 0
        times.append(times[-1] + options.response_time + 60.0 * words / options.typing_wpm)
    return times


def _add_session(builder: TraceBuilder, sid: str, items: Sequence[Rendered],
                 arrivals: Sequence[float], limit: int | None) -> int:
    """Add the session's requests up to the first over-long prompt; returns how many.

    Walking back from the last request, one whose prompt + reply is a prefix of the
    buffer in hand is a view into it; any other gets a buffer of its own.
    """
    n = next((k for k, item in enumerate(items) if limit is not None
              and item.prompt.shape[0] > limit), len(items))
    spans: list[tuple[int, int, int]] = []
    buffer, base = np.zeros(0, np.int32), 0
    for item in reversed(items[:n]):
        full = np.concatenate([item.prompt, item.reply])
        if full.shape[0] > buffer.shape[0] or not np.array_equal(buffer[:full.shape[0]], full):
            buffer, base = full, builder.add_buffer(full)
        builder.add_marks(base, item.ends)
        spans.append((base, base + item.prompt.shape[0], base + full.shape[0]))
    for turn, ((start, mid, stop), arrival) in enumerate(zip(reversed(spans), arrivals,
                                                             strict=False)):
        builder.add_request(sid, turn, arrival, (start, mid), (mid, stop))
    return n
