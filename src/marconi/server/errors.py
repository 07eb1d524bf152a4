"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

FastAPI's default 422 for a bad body becomes a 400 whose message names the field, as
OpenAI answers; unknown routes and methods keep their status with the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from marconi.server.schemas import error_body

log = logging.getLogger("marconi.server")


class ApiError(Exception):
    """An error to answer with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status, message, kind, param, code)

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code),
                            status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts)


def describe(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One readable line (and the field) for pydantic's first error."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON: {detail}".rstrip(": "), None
    field = _field(first.get("loc", ()))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        message = "required field is missing"
    return f"{field or 'request body'}: {message}", (field or None)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error OpenAI's shape."""

    async def on_api_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, ApiError)
        return err.response()

    async def on_validation(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        message, param = describe(err.errors())
        return bad_request(message, param).response()

    async def on_http(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return ApiError(err.status_code, str(err.detail), kind).response()

    async def on_crash(request: Request, err: Exception) -> JSONResponse:
        log.exception("request failed", exc_info=err)
        return ApiError(500, f"internal error: {err}", "internal_error").response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)
