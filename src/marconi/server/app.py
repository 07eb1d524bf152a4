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

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from marconi.server import errors
from marconi.server.backend import Backend
from marconi.server.config import ServerConfig
from marconi.server.metrics import ServerMetrics
from marconi.server.scheduler import Scheduler
from marconi.server.schemas import (
    ChatRequest,
    CompletionRequest,
    chat_body,
    completion_body,
    new_id,
)
from marconi.server.service import Service, Submission
from marconi.server.streaming import ChunkStream

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

    app = FastAPI(title="marconi", lifespan=lifespan)
    errors.install(app)
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
    make = chat_body if chat else completion_body
    return JSONResponse(make(rid, service.backend.name, done.text, done.reason,
                             done.generation))


def _routes(app: FastAPI, service: Service) -> None:
    codec = service.backend.codec

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if isinstance(body.prompt, str):
            prompt = codec.encode_prompt(body.prompt)
        else:
            prompt = _token_prompt(body.prompt, service.backend.engine.model.vocab_size)
        sub = service.submit(body, prompt, body.max_tokens, "prompt")
        return await _respond(service, sub, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        service.check_model(body.model)
        try:
            prompt, ends = codec.render([m.to_message() for m in body.messages])
        except ValueError as err:
            raise errors.bad_request(str(err), param="messages") from None
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


def _token_prompt(tokens: list[int], vocab: int) -> list[int]:
    if not tokens:
        raise errors.bad_request("prompt: must not be empty", param="prompt")
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise errors.bad_request(f"prompt: token id {bad[0]} outside the vocabulary "
                                 f"[0, {vocab})", param="prompt")
    return tokens
