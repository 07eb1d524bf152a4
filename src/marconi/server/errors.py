"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

FastAPI's default 422 for a bad body becomes a 400 whose message names the field, as
OpenAI answers (without pydantic's union branch names: `messages.0.content`, never
`messages.0.content.str`); unknown routes and methods keep their status with the same
shape. Every 4xx is counted by the reason it gives (`Rejected`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from marconi.core.units import format_size
from marconi.server.bodies import error_body

log = logging.getLogger("marconi.server")
Rejected = Callable[[str], object]  # called with the reason of each 4xx answered
_BRANCH_MARKS = ("[", "(", "-")  # in pydantic's names for union members: list[int], ...
_BRANCH_NAMES = {"str", "int", "float", "bool", "none"}


class AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: an error may quote what a client sent, and whatever that
    holds (a lone surrogate) must not make the error itself fail to encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


class ApiError(Exception):
    """An error to answer with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None, rejects: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status, message, kind, param, code)
        self.headers = dict(headers or {})
        self.rejects = rejects  # False: a queued request that failed (counted as a failure)

    @property
    def reason(self) -> str:
        """The label this error is counted under."""
        return self.code or {404: "not_found", 413: "too_large"}.get(self.status,
                                                                    "invalid_request")

    def response(self) -> JSONResponse:
        return AsciiJSON(error_body(self.message, self.kind, self.param, self.code),
                         status_code=self.status, headers=self.headers)


class BodyTooLarge(HTTPException):
    """A request body past the limit (an HTTPException, so FastAPI's body parsing passes
    it on instead of answering "error parsing the body"). `drained`: the rest of the body
    was read and dropped, so the connection can serve another request."""

    def __init__(self, limit: int, drained: bool) -> None:
        super().__init__(413, f"request body: larger than this server's limit of "
                              f"{format_size(limit)} (--max-body-size)")
        self.drained = drained

    def error(self) -> ApiError:
        close = {} if self.drained else {"Connection": "close"}
        return ApiError(413, str(self.detail), code="body_too_large", headers=close)


class BodyTimeout(HTTPException):
    """A request body that stalled: no bytes for `seconds` while more were expected."""

    def __init__(self, seconds: float, whole: bool = False) -> None:
        super().__init__(408, f"request body: not complete within {seconds:g} s "
                              "(--body-deadline); send it at a steady rate" if whole else
                              f"request body: no bytes arrived for {seconds:g} s "
                              "(--body-timeout); send the body without pausing")

    def error(self) -> ApiError:
        return ApiError(408, str(self.detail), code="body_timeout",
                        headers={"Connection": "close"})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _path(loc: Sequence[Any]) -> tuple[str, ...]:
    """The field's path, without "body" and the names pydantic gives union members."""
    return tuple(str(p) for p in loc if p != "body" and not (
        isinstance(p, str) and (p in _BRANCH_NAMES or any(m in p for m in _BRANCH_MARKS))))


def _text(error: Mapping[str, Any]) -> str:
    if error.get("type") == "missing":
        return "required field is missing"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def describe(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One readable line (and the field) for the first bad field.

    Each member of a union reports an error: one saying what is wrong with a value of the
    right type (a lone surrogate, a list's bad item) beats "should be a valid string", the
    deepest wins, and members failing alike at one place are joined ("should be a valid
    string or a valid list").
    """
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON: {detail}".rstrip(": "), None
    top = _path(first.get("loc", ()))[:1]
    same = [e for e in errors if _path(e.get("loc", ()))[:1] == top]
    specific = [e for e in same if not str(e.get("type", "")).endswith("_type")] or same
    where = max((_path(e.get("loc", ())) for e in specific), key=len)
    texts = list(dict.fromkeys(_text(e) for e in specific if _path(e.get("loc", ())) == where))
    if len(texts) > 1 and all(t.startswith("Input should be ") for t in texts):
        texts = ["should be " + " or ".join(t.removeprefix("Input should be ") for t in texts)]
    field = ".".join(where)
    return f"{field or 'request body'}: {'; '.join(texts)}", (field or None)


def install(app: FastAPI, rejected: Rejected) -> None:
    """Register the handlers that give every error OpenAI's shape and count the 4xx."""

    def answer(err: ApiError) -> JSONResponse:
        if err.rejects and 400 <= err.status < 500:
            rejected(err.reason)
        return err.response()

    async def on_api_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, ApiError)
        return answer(err)

    async def on_validation(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        message, param = describe(err.errors())
        return answer(bad_request(message, param))

    async def on_http(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        if isinstance(err, BodyTimeout):
            log.info("%s %s: %s: answered 408", request.method, request.url.path, err.detail)
        if isinstance(err, BodyTooLarge | BodyTimeout):
            return answer(err.error())
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return answer(ApiError(err.status_code, str(err.detail), kind, headers=err.headers))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
