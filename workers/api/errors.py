"""Every error as JSON `{"error": {"code", "message"}}`: domain errors are mapped here, at the edge."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from kenning.pipeline.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    InputError,
    KenningError,
    LLMError,
    LockLost,
    NoLLMConfigured,
    NotFound,
    QueryBudgetExceeded,
    StoreError,
)
from kenning.pipeline.locking import LockBusy
from kenning.retrieval.cypher import QueryRejected

log = logging.getLogger("kenning.api")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An answer other than success, raised by a route: its status, stable code and message."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


# Domain error -> (status, code); the first match wins, so subclasses come before their bases.
MAPPED: tuple[tuple[type[KenningError], int, str], ...] = (
    (NotFound, 404, "not_found"),
    (Forbidden, 403, "forbidden"),
    (QueryRejected, 403, "query_rejected"),
    (Conflict, 409, "conflict"),
    (LockBusy, 409, "dataset_busy"),
    (LockLost, 409, "dataset_busy"),
    (QueryBudgetExceeded, 422, "query_budget_exceeded"),
    (StoreError, 503, "store_unavailable"),
    (LLMError, 502, "llm_error"),
    (NoLLMConfigured, 400, "not_configured"),
    (ConfigError, 400, "not_configured"),
    (InputError, 400, "invalid_input"),
)
METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
CODE_OF_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
}
# What every route may answer besides success, for the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "Invalid input, or a feature that is not configured"),
        (401, "No API key, or an unknown or revoked one"),
        (403, "The action needs another permission, or a Cypher query is refused (off, or not read-only)"),
        (404, "No such object, or none the caller may read"),
        (409, "A conflict: the object exists, or the dataset is busy"),
        (413, "The request body is over the size limit"),
        (415, "The content type is not accepted here"),
        (422, "The request does not match its schema"),
        (429, "Too many unknown API keys from this address: wait Retry-After seconds"),
        (502, "The LLM endpoint failed"),
        (503, "A store is unavailable"),
    )
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(KenningError, _domain_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _domain_error(_request: Request, exc: Exception) -> JSONResponse:
    for kind, status, code in MAPPED:
        if isinstance(exc, kind):
            return error_response(status, code, str(exc))
    return error_response(400, "invalid_input", str(exc))


async def _invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = problem_text(exc.errors())
    return error_response(422, "invalid_request", problems or "the request does not match its schema")


def problem_text(errors: Sequence[Any], *field: str) -> str:
    """Each problem as `location: what is wrong`, under `field` when one is given; without the
    validator's own wording ("Value error, ")."""
    return "; ".join(
        f"{'.'.join(str(part) for part in (*field, *error['loc']))}: {_plain(error['msg'])}"
        for error in errors
    )


def _plain(message: str) -> str:
    return message.removeprefix("Value error, ")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = CODE_OF_STATUS.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 405:
        # The router names the methods of the first route that matched the path; a path served
        # by several routes (one per method) allows all of theirs.
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
    return error_response(exc.status_code, code, message, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method that some route of the app answers at the request's path (each asked as the
    router would, so routes of included routers count too)."""
    routes = request.app.routes
    return [method for method in METHODS if any(_answers(route, request, method) for route in routes)]


def _answers(route: BaseRoute, request: Request, method: str) -> bool:
    return route.matches({**request.scope, "method": method})[0] is Match.FULL


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "an unexpected error; the server log has its details")
