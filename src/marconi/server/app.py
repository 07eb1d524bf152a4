"""The FastAPI application: OpenAI routes, health and Prometheus metrics.

| route | what |
| --- | --- |
| `POST /v1/completions` | text (or token-id) prompt |
| `POST /v1/chat/completions` | messages through the model's chat template |
| `GET /v1/models` | the one model served |
| `GET /health` | 200 while the engine worker lives |
| `GET /metrics` | Prometheus text format |

Bodies are parsed by `parsing.BodyParser` (a large one in a separate process, so no body
stalls the event loop); `uvicorn_config` runs the app behind the protocol of
`connections.py` (header timeout, connection bound).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from marconi.server import errors
from marconi.server.backend import Backend
from marconi.server.bodies import chat_body, completion_body, new_id
from marconi.server.config import ServerConfig
from marconi.server.connections import protocol_class
from marconi.server.guard import Guard
from marconi.server.logprobs import chat_logprobs, completion_logprobs
from marconi.server.metrics import ServerMetrics
from marconi.server.parsing import BodyParser, Limits
from marconi.server.scheduler import Scheduler
from marconi.server.schemas import ChatRequest, CompletionRequest
from marconi.server.service import Service, Submission
from marconi.server.streaming import ChunkStream

log = logging.getLogger("marconi.server")
CLIENT_GONE = 499  # nginx's "client closed request": logged, never received by anyone
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(backend: Backend, config: ServerConfig) -> FastAPI:
    """An app serving `backend`; its engine worker runs while the app's lifespan does."""
    metrics = ServerMetrics(backend.engine)
    scheduler = Scheduler(backend.engine, metrics, config.max_queue)
    metrics.track_queue(lambda: scheduler.waiting, lambda: scheduler.running)
    service = Service(backend, scheduler, metrics, config.max_tokens)
    parser = BodyParser(Limits(served=backend.name, context=backend.max_context,
                               messages=config.max_messages,
                               parts=config.max_content_parts))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.stop()
        service.close()
        parser.close()
        backend.close()

    def rejected(reason: str) -> None:
        metrics.rejected.labels(reason=reason).inc()

    app = FastAPI(title="marconi", lifespan=lifespan)
    errors.install(app, rejected)
    app.add_middleware(Guard, max_body=config.body_limit(backend.max_context),
                       rejected=rejected, crashed=metrics.failed.labels(reason="internal").inc,
                       gone=metrics.failed.labels(reason="disconnected").inc,
                       body_timeout=config.body_timeout, body_deadline=config.body_deadline)
    app.state.http_protocol = protocol_class(config.header_timeout, config.max_connections,
                                             rejected)
    app.state.parser = parser
    _routes(app, service, parser)
    return app


def settle() -> None:
    """For a process about to serve an app and nothing else (`marconi serve`): what is
    alive now (torch, the model, the app) lives as long as the process, so it is moved out
    of the garbage collector's sight, and a full collection no longer walks it (with it,
    one stalled every client for a few hundred milliseconds when a burst of 150 timed-out
    bodies was answered; `benchmarks/bench_body_stall.py`). Not for a process that makes
    many servers (a test suite): garbage it holds now would never be collected."""
    gc.collect()
    gc.freeze()


def uvicorn_config(app: FastAPI, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for an app `create_app` made: its HTTP protocol (uvicorn's h11
    with the header timeout and the connection bound, `connections.py`) and `options`."""
    return uvicorn.Config(app, http=app.state.http_protocol, **options)


async def _respond(service: Service, sub: Submission, body: CompletionRequest | ChatRequest,
                   request: Request, chat: bool) -> Response:
    """Stream the submitted request as server-sent events, or wait for it and answer with
    the endpoint's JSON body."""
    rid = new_id("chatcmpl" if chat else "cmpl")
    if body.stream:
        opts = body.stream_options
        stream = ChunkStream(service, sub, rid=rid, model=service.backend.name, chat=chat,
                             include_usage=bool(opts and opts.include_usage))
        return StreamingResponse(stream.lines(), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    done = await service.collect(sub, request)
    if done is None:
        log.info("%s: the client disconnected; its request was cancelled", rid)
        return Response(status_code=CLIENT_GONE)
    logprobs = None
    if (top := body.alternatives()) is not None:
        entries = await service.logprobs(sub, done, top)
        logprobs = chat_logprobs(entries) if chat else completion_logprobs(entries)
    make = chat_body if chat else completion_body
    return JSONResponse(make(rid, service.backend.name, done.text, done.reason,
                             done.generation, logprobs))


async def _chunks(request: Request) -> list[bytes]:
    """The request's body as received (see `BodyParser.parse`)."""
    return [chunk async for chunk in request.stream() if chunk]


def _routes(app: FastAPI, service: Service, parser: BodyParser) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = (await parser.parse(await _chunks(request), "completion")).body
        assert isinstance(body, CompletionRequest)
        service.check_model(body.model)
        prompt = await service.encode(body.prompt)
        sub = service.submit(body, prompt, body.max_tokens, "prompt")
        return await _respond(service, sub, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        parsed = await parser.parse(await _chunks(request), "chat")
        body, messages = parsed.body, parsed.messages
        assert isinstance(body, ChatRequest) and messages is not None
        service.check_model(body.model)
        prompt, ends = await service.render(messages)
        sub = service.submit(body, prompt, body.requested_tokens(), "messages", ends)
        return await _respond(service, sub, body, request, chat=True)

    _info_routes(app, service)


def _info_routes(app: FastAPI, service: Service) -> None:
    started = int(time.time())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": service.backend.name, "object": "model", "created": started,
                "owned_by": "marconi", "max_model_len": service.backend.max_context}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/health")
    async def health() -> JSONResponse:
        if not service.scheduler.alive:
            raise errors.ApiError(503, "the engine worker has stopped", "internal_error")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

