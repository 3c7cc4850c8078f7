"""Every error as a JSON body naming the problem: ``{"error": code, "message": ..., "detail"}``.

localstate's typed errors map to statuses (the table, both directions, is
`localstate._core.protocol`'s):

=====================================================  =====  ====================
InvalidName, ValueEncodingError, InvalidInput          422    invalid_name, invalid_value,
                                                              invalid_input
ValueTooLarge                                          413    value_too_large
VersionConflict                                        409    version_conflict
VersionExhausted (a key at version 2^63 - 1)           409    version_exhausted
WriteRejected (the central DB kept another writer's)   409    write_rejected
CentralUnavailable                                     503    central_unavailable
CentralError                                           502    central_error
StoreClosed, CacheError                                503    store_unavailable
=====================================================  =====  ====================

Bad requests FastAPI itself refuses (a query or body that does not validate, JSON that does not
parse) are 422 ``validation_error`` with pydantic's list in ``detail``. Anything unforeseen is
a 500 ``internal_error``. A client that closes its connection before its request's body
arrived (a triggerer killed or stopped mid-flush) is no server failure: nothing was read, so
nothing was done; it is logged at info and answered 499 ``client_closed_request`` (which no one
receives). No 5xx body says anything of the internals (a DB URL, SQL, the
driver's words, paths, a traceback): those go to the log, under a request id the body carries
(``detail.request_id``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from localstate._core.protocol import answer_for
from localstate.errors import LocalStateError

__all__ = ["ApiError", "error_response", "install_error_handlers", "request_id"]

log = logging.getLogger("localstate.api.errors")

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "too_large", 422: "invalid_input"}


class ApiError(StarletteHTTPException):
    """Raised by a route: answered as `status` with the JSON error body. An HTTP exception,
    so FastAPI passes it on as it is when it comes from reading the body (a body refused as
    it arrives), where it turns other exceptions into a bare 400."""

    def __init__(self, status: int, error: str, message: str, *, detail: Any = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status, message, dict(headers or {}))
        self.status = status
        self.error = error
        self.message = message
        self.detail = detail
        self.headers = dict(headers or {})


def error_response(status: int, error: str, message: str, detail: Any = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"error": error, "message": message, "detail": jsonable_encoder(detail)}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def from_store_error(exc: LocalStateError) -> ApiError:
    """The API error for one of localstate's typed errors (the table:
    `localstate._core.protocol.answer_for`)."""
    answer = answer_for(exc)
    headers = {"Retry-After": "5"} if answer.retry_after else None
    if answer.public is not None:
        return _logged(answer.status, answer.code, answer.public, exc, headers=headers)
    return ApiError(answer.status, answer.code, str(exc), detail=answer.detail, headers=headers)


def request_id() -> str:
    """A new id that ties an error's body to its lines in the server's log."""
    return uuid.uuid4().hex[:16]


def _logged(status: int, error: str, public: str, exc: BaseException, *,
            headers: Mapping[str, str] | None = None) -> ApiError:
    """A server-side failure: its text (a DB URL, SQL, the driver's words, paths) goes to the
    log under a request id; the body says what happened in general, and carries the id."""
    rid = request_id()
    log.error("API request %s failed (%s %s): %s", rid, status, error, exc,
              exc_info=exc if status == 500 else None)
    return ApiError(status, error, f"{public}; the server's log has the details under "
                    f"request id {rid}", detail={"request_id": rid}, headers=headers)


def _where(loc: Any) -> str:
    parts = [str(p) for p in loc] if isinstance(loc, list | tuple) else [str(loc)]
    return ".".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.error, exc.message, exc.detail, exc.headers)

    async def store_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, LocalStateError)
        e = from_store_error(exc)
        return error_response(e.status, e.error, e.message, e.detail, e.headers)

    async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        message = "; ".join(f"{_where(e.get('loc', ()))}: {e.get('msg', 'invalid')}"
                            for e in errors[:5]) or "the request does not validate"
        detail = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in errors]
        return error_response(422, "validation_error", message, detail)

    async def http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(exc.status_code, _CODES.get(exc.status_code, "http_error"),
                              str(exc.detail), headers=exc.headers)

    async def client_gone(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ClientDisconnect)
        log.info("%s %s: the client closed the connection before its request body arrived; "
                 "nothing was done", request.method, request.url.path)
        return error_response(499, "client_closed_request",
                              "the client closed the connection before its request body arrived")

    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        e = _logged(500, "internal_error", "the server failed on this request", exc)
        return error_response(e.status, e.error, e.message, e.detail, e.headers)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(LocalStateError, store_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(Exception, unexpected)
