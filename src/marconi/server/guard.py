"""ASGI middleware in front of the routes: body-size and body-read limits, a last-resort 500.

- A body declared (`Content-Length`, or a chunk's header whose size would take the body
  past the limit: `CHUNK_PROMISED`) or found while reading to exceed
  `max_body` bytes is refused with a 413 before any of it is parsed, so no client can make the event
  loop parse or tokenize megabytes that could never fit the model's context. The rest
  of it is read and dropped first (up to `DRAIN_BYTES`): a client still sending would
  otherwise see its connection reset instead of the answer.
- A request body that stalls, no byte arriving for `body_timeout` seconds while the
  application waits for more, or that is not complete `body_deadline` seconds after the
  application first asked for it (a byte dripped every few seconds never stalls), is
  answered 408 (`body_timeout`, `Connection: close`) and logged in one line. Once the
  body is complete, `receive` (which then only waits for the client to disconnect) is
  passed through untimed.
- An exception no handler knows becomes a 500 in OpenAI's shape here, and the
  connection stays usable: Starlette's own last-resort handler answers and then re-raises,
  which makes uvicorn drop a keep-alive connection (the client's next request fails).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marconi.server.errors import ApiError, BodyTimeout, BodyTooLarge, Rejected

CHUNK_PROMISED = "marconi.chunk_promised"  # scope key: () -> bytes the current chunk owes,
# set by connections.py's protocol

log = logging.getLogger("marconi.server")
DRAIN_BYTES = 64 * 2**20  # past this a refused body is not read: the connection is closed


class Guard:
    """Wraps the app (inside Starlette's error middleware, outside the routes)."""

    def __init__(self, app: ASGIApp, max_body: int, rejected: Rejected,
                 crashed: Callable[[], object], gone: Callable[[], object] = lambda: None,
                 body_timeout: float = 30.0, body_deadline: float = 120.0) -> None:
        self.app, self.max_body, self.rejected, self.crashed = app, max_body, rejected, crashed
        self.gone = gone  # a client that left before its request was read
        self.body_timeout, self.body_deadline = body_timeout, body_deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        receive = self._timed(receive)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            await self._refuse(int(declared), scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._limited(receive, scope), watched)
        except ClientDisconnect:  # it left while sending its body: nobody to answer
            log.info("%s %s: the client disconnected while sending its body",
                     scope.get("method", ""), scope.get("path", ""))
            self.gone()
        except Exception as err:
            if started:  # mid-response: nothing left to answer with
                raise
            log.exception("request failed", exc_info=err)
            self.crashed()
            error = ApiError(500, f"internal error: {type(err).__name__}: {err}",
                             "internal_error")
            await error.response()(scope, receive, send)

    async def _refuse(self, declared: int, scope: Scope, receive: Receive, send: Send) -> None:
        drained = declared <= DRAIN_BYTES and await drain(receive, DRAIN_BYTES)
        error = BodyTooLarge(self.max_body, drained).error()
        self.rejected(error.reason)
        await error.response()(scope, receive, send)

    def _limited(self, receive: Receive, scope: Scope) -> Receive:
        """`receive` that raises BodyTooLarge once the body read, with what the current
        chunk still promises, passes the limit: as for a declared `Content-Length`, the
        rest is read and dropped when it is within `DRAIN_BYTES`, else the connection is
        closed at once (a chunk promising gigabytes is not waited for)."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            promised = scope.get(CHUNK_PROMISED)
            owed = promised() if promised is not None and message.get("more_body") else 0
            if seen + owed > self.max_body:
                drained = not message.get("more_body", False) or (
                    seen + owed <= DRAIN_BYTES and await drain(receive, DRAIN_BYTES - seen))
                raise BodyTooLarge(self.max_body, drained)
            return message

        return limited

    def _timed(self, receive: Receive) -> Receive:
        """`receive` that raises BodyTimeout when the body stalls for `body_timeout`, or is
        not complete `body_deadline` seconds after it was first asked for."""
        complete, deadline = False, None

        async def timed() -> Message:
            nonlocal complete, deadline
            if complete:
                return await receive()
            now = asyncio.get_running_loop().time()
            deadline = now + self.body_deadline if deadline is None else deadline
            whole = deadline - now < self.body_timeout  # the deadline comes first
            try:
                async with asyncio.timeout(min(self.body_timeout, deadline - now)):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.body_deadline if whole else self.body_timeout,
                                  whole) from None
            complete = message["type"] != "http.request" or not message.get("more_body")
            return message

        return timed


async def drain(receive: Receive, budget: int) -> bool:
    """Read the rest of a request's body, keeping none of it; False if the client left,
    stalled, or more than `budget` bytes remain."""
    while budget >= 0:
        try:
            message = await receive()
        except BodyTimeout:
            return False
        if message["type"] != "http.request":
            return False
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return budget >= 0
    return False
