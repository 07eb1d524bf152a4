"""uvicorn's HTTP/1.1 protocol (h11) with a header timeout and a bound on connections.

uvicorn closes a connection idle between requests (`timeout_keep_alive`) but waits
forever for the headers of a request: a client that connects and sends nothing, or half
a header line, holds its connection (and a file descriptor) as long as it likes, and a few
hundred such clients slow everyone else. Here:

- a request's headers must arrive within `header_timeout` seconds of the connection
  opening or of the request's first byte; past that the connection is closed (there is
  no request to answer), logged in one line and counted as `header_timeout`;
- a connection opened while `max_connections` are already open gets a 503 for its request
  (OpenAI's error shape, `Connection: close`), counted as `too_many_connections`; except
  `GET /health`, always answered: a flood of connections must not make an orchestrator's
  liveness probe restart a server that is alive.

A client that said its request is its last (HTTP/1.0, or `Connection: close`) and then
half-closes its end (`nc -N`) still gets its answer: the end of its input is not taken
for a disconnect while that request is answered, and the connection closes after it.
From any other client the end of input is its leaving, as before (a request still
waiting is then cancelled: the two cannot be told apart at the socket).

A response sent before its request's body has arrived whole (a route that reads no body,
given one) closes the connection: the body's timeouts run only while a route waits for
it, and uvicorn's keep-alive timeout restarts with every byte, so a body dripped into
`GET /health` would hold the connection forever.

A stalled body is the ASGI middleware's to time out (`guard.py`): the protocol sees bytes,
the middleware sees what the application is waiting for. So is a body too large, with one
thing only the protocol sees: the bytes a chunked body's current chunk still promises (its
declared size, less what has arrived). The protocol hands that count to the middleware in
the request's scope (`guard.CHUNK_PROMISED`), and wakes the application when a chunk's header
arrives without its bytes, so a chunk declared past the limit is refused before it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from marconi.server.errors import ApiError, Rejected
from marconi.server.guard import CHUNK_PROMISED, drain

log = logging.getLogger("marconi.server")
RETRY_AFTER_S = 1
REFUSED_DRAIN_BYTES = 1 << 20  # of a refused request's body read before answering


def protocol_class(header_timeout: float, max_connections: int,
                   rejected: Rejected) -> type[asyncio.Protocol]:
    """The protocol uvicorn is to run (its `http` setting) for one server: `Protocol`
    with this server's settings (uvicorn makes one instance per connection)."""
    return type("Protocol", (Protocol,), {"header_timeout": header_timeout,
                                          "max_connections": max_connections,
                                          "rejected": staticmethod(rejected)})


class Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header timeout and the connection bound (the
    defaults here; `protocol_class` sets a server's own)."""

    header_timeout: float = 10.0
    max_connections: int = 512
    rejected: Rejected = staticmethod(lambda reason: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._served: Any = None  # the application, where `_refuse` stands in for it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self._served = self.app
            self.app = self._refuse  # answers this connection's request, then closes it
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._header_timer is None:  # the first bytes of a request's headers
                self._arm()
            return
        self._disarm()  # the headers are in (or the connection is done)
        scope, cycle = getattr(self, "scope", None), self.cycle
        if scope is None or cycle is None or self.conn.their_state is not h11.SEND_BODY:
            return
        scope.setdefault(CHUNK_PROMISED, self._chunk_promised)
        if self._chunk_promised() and not cycle.message_event.is_set():
            cycle.message_event.set()  # a chunk header alone: let the middleware see it

    def _chunk_promised(self) -> int:
        """Bytes of the current chunk declared and not yet arrived (0 unless chunked).
        h11 keeps the count in its chunked reader (`_bytes_in_chunk`, h11 0.14-0.16); a
        test fails if a new h11 moves it."""
        return int(getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0))

    def on_response_complete(self) -> None:
        """A response sent while its request's body is still arriving (a route that reads
        no body: `GET /health` with a `Content-Length`) ends the connection. Kept open,
        a client dripping the body faster than the keep-alive timeout would hold it (and
        a connection slot) forever: uvicorn drops the bytes but restarts that timeout
        on each of them, and no route waits for them, so no body timeout runs."""
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.info("closed the connection of %s after answering %s %s: its request's "
                     "body, which the route does not read, was still arriving", client,
                     self.scope.get("method", ""), self.scope.get("path", ""))
            self.transport.close()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client sent all it will send. One that said its request, sent whole, was its
        last (h11's MUST_CLOSE) is answered first (True keeps the transport open); any
        other has left."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete \
                and self.conn.their_state is h11.MUST_CLOSE:
            cycle.keep_alive = False
            return True
        return None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("closed the connection of %s: no complete request headers within %g s "
                 "(--header-timeout)", client, self.header_timeout)
        self.rejected("header_timeout")
        self.transport.close()

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") == "GET" and scope.get("path") == "/health":
            await self._served(scope, receive, send)  # the liveness probe: never refused
            return
        log.warning("%s %s: refused (503), over %d open connections (--max-connections)",
                    scope.get("method", ""), scope.get("path", ""), self.max_connections)
        self.rejected("too_many_connections")
        with contextlib.suppress(TimeoutError):  # read what the client sent (bounded), so
            # closing the connection does not reset it before the answer is read
            await asyncio.wait_for(drain(receive, REFUSED_DRAIN_BYTES), self.header_timeout)
        error = ApiError(503, f"this server is at its limit of {self.max_connections} open "
                         "connections (--max-connections); retry shortly", "server_error",
                         code="too_many_connections",
                         headers={"Connection": "close", "Retry-After": str(RETRY_AFTER_S)})
        await error.response()(scope, receive, send)
