"""The FastAPI application: OpenAI routes, health and Prometheus metrics.

| route | what |
| --- | --- |
| `POST /v1/completions` | text (or token-id) prompt |
| `POST /v1/chat/completions` | messages through the model's chat template |
| `GET /v1/models` | the one model served |
| `GET /health` | 200 while the engine worker lives |
| `GET /metrics` | Prometheus text format |
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from marconi.server import errors
from marconi.server.backend import Backend
from marconi.server.bodies import chat_body, completion_body, new_id
from marconi.server.config import ServerConfig
from marconi.server.guard import Guard
from marconi.server.logprobs import chat_logprobs, completion_logprobs
from marconi.server.metrics import ServerMetrics
from marconi.server.scheduler import Scheduler
from marconi.server.schemas import ChatRequest, CompletionRequest
from marconi.server.service import Service, Submission
from marconi.server.streaming import ChunkStream

log = logging.getLogger("marconi.server")
Body = TypeVar("Body", bound=BaseModel)
CLIENT_GONE = 499  # nginx's "client closed request": logged, never received by anyone
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(backend: Backend, config: ServerConfig) -> FastAPI:
    """An app serving `backend`; its engine worker runs while the app's lifespan does."""
    metrics = ServerMetrics(backend.engine)
    scheduler = Scheduler(backend.engine, metrics, config.max_queue)
    metrics.track_queue(lambda: scheduler.waiting, lambda: scheduler.running)
    service = Service(backend, scheduler, metrics, config.max_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.stop()
        service.close()

    def rejected(reason: str) -> None:
        metrics.rejected.labels(reason=reason).inc()

    app = FastAPI(title="marconi", lifespan=lifespan)
    errors.install(app, rejected)
    app.add_middleware(Guard, max_body=config.body_limit(backend.max_context),
                       rejected=rejected, crashed=metrics.failed.labels(reason="internal").inc,
                       gone=metrics.failed.labels(reason="disconnected").inc)
    _routes(app, service)
    return app


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


INLINE_BODY = 256 << 10  # bytes of body parsed on the event loop; larger ones on a thread


async def parse_body(request: Request, model: type[Body],
                     precheck: Callable[[bytes], None] | None = None) -> Body:
    """The request's JSON body as `model`: decoded and validated on a worker thread when
    it is large, so `/health` and every other client are answered meanwhile. Errors are
    FastAPI's (the same 400s, counted). `precheck(raw)` may refuse the body first, from a
    skim that builds nothing big: a thread does not free the event loop from one long C
    call holding the GIL (decoding 10M token ids takes seconds in one)."""
    raw = await request.body()
    if len(raw) <= INLINE_BODY:
        return _validated(raw, model, precheck)
    return await asyncio.to_thread(_validated, raw, model, precheck)


def _validated(raw: bytes, model: type[Body], precheck: Callable[[bytes], None] | None) -> Body:
    if precheck is not None:
        precheck(raw)
    try:  # UTF-8 only: json.loads would take bytes in UTF-16 or UTF-32 as well
        value = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", err.pos),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": err.msg}}]) from None
    except UnicodeDecodeError as err:
        raise errors.bad_request(f"request body is not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise errors.bad_request("request body: JSON nested too deeply") from None
    try:
        return model.model_validate(value)
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in err.errors()]) from None


def _routes(app: FastAPI, service: Service) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest, service.precheck_prompt)
        service.check_model(body.model)
        prompt = await service.encode(body.prompt)
        sub = service.submit(body, prompt, body.max_tokens, "prompt")
        return await _respond(service, sub, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await parse_body(request, ChatRequest)
        service.check_model(body.model)
        prompt, ends = await service.render([m.to_message() for m in body.messages])
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

