"""Exceptions to JSON error answers. Every answer names the field or the state at fault."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from dispatcher import errors

logger = logging.getLogger(__name__)


def field_name(location: Sequence[int | str]) -> str:
    """("body", "jobs", 3, "routing_key") -> "jobs[3].routing_key"; a mapping's key is named by
    itself: ("body", "headers", "x-death", "[key]") -> "headers.x-death"."""
    if location and location[-1] == "[key]":
        location = location[:-1]
    name = ""
    for part in location:
        if part in ("body", "query", "path") and not name:
            continue
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name or "body"


def problem(
    status: int,
    error: str,
    message: str,
    *,
    fields: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    body: dict[str, Any] = {"error": error, "message": message, "fields": fields or []}
    body.update(extra)
    # ASCII-escaped: a field name echoed from the request may hold a lone surrogate, which
    # UTF-8 cannot encode (JSONResponse would fail and answer 500).
    content = json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode()
    return Response(content, status_code=status, headers=headers, media_type="application/json")


async def refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    error: str,
    message: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer from a middleware, before the app reads the body, and close the connection: what
    the client may still be sending is never read."""
    named = [{"field": field, "message": message}] if field else None
    answer = problem(status, error, message, fields=named, headers={**(headers or {})})
    answer.headers["connection"] = "close"
    await answer(scope, receive, send)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    fields = []
    for error in exc.errors():
        location = error.get("loc", ())
        if error.get("type") == "json_invalid":
            # The location is a character offset into the body, not a field.
            message = f"not valid JSON near character {location[-1] if location else 0}"
            fields = [{"field": "body", "message": message}]
            return problem(400, "malformed_json", f"body: {message}", fields=fields)
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        fields.append({"field": field_name(location), "message": message})
    summary = "; ".join(f"{item['field']}: {item['message']}" for item in fields)
    return problem(422, "invalid_request", summary, fields=fields)


async def _dispatcher_error(request: Request, exc: Exception) -> Response:
    return dispatcher_problem(exc)


# The errors that always name one field: (status, error, field).
_ONE_FIELD: dict[type[Exception], tuple[int, str, str]] = {
    errors.ScheduleExists: (409, "conflict", "name"),
    errors.ScheduleLimitReached: (409, "limit_reached", "name"),
    errors.FlowRuleLimitReached: (409, "limit_reached", "key"),
    errors.BulkLimitReached: (409, "limit_reached", "action"),
}


def dispatcher_problem(exc: Exception) -> Response:
    """The answer to a DispatcherError, named by its field or state."""
    if (one := _ONE_FIELD.get(type(exc))) is not None:
        status, error, field = one
        return problem(status, error, str(exc), fields=[{"field": field, "message": str(exc)}])
    match exc:
        case errors.InvalidField():
            fields = [{"field": exc.field, "message": exc.detail}]
            return problem(422, "invalid_request", str(exc), fields=fields)
        case errors.KeyConflict():
            fields = [{"field": exc.field, "message": exc.detail}]
            return problem(409, "conflict", str(exc), fields=fields)
        case errors.PayloadTooLarge():
            fields = [{"field": exc.field, "message": str(exc)}]
            return problem(413, "payload_too_large", str(exc), fields=fields)
        case errors.Unauthenticated():
            answer = problem(401, "unauthenticated", str(exc))
            answer.headers["WWW-Authenticate"] = "Bearer"
            return answer
        case errors.Forbidden():
            named = [{"field": exc.field, "message": str(exc)}] if exc.field else None
            return problem(403, "forbidden", str(exc), fields=named)
        case errors.JobNotFound():
            return problem(404, "not_found", str(exc))
        case errors.ScheduleNotFound() | errors.FlowRuleNotFound() | errors.BulkActionNotFound():
            return problem(404, "not_found", str(exc))
        case errors.Busy():
            answer = problem(429, "busy", str(exc))
            answer.headers["Retry-After"] = str(exc.retry_after_s)
            return answer
        case errors.ScheduleQuotaReached():
            named = [{"field": exc.field, "message": str(exc)}]
            return problem(409, "quota_reached", str(exc), fields=named)
        case errors.JobStateConflict():
            return problem(409, "conflict", str(exc), state=exc.state)
        case errors.StoreUnavailable():
            logger.warning("answering 503: %s", exc)
            return problem(503, "unavailable", "the job store is unavailable; retry later")
    logger.exception("unexpected dispatcher error", exc_info=exc)
    return problem(500, "internal", "internal error")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's answer to a body it could not even decode (not UTF-8): name the body too.
        message = "not a JSON document (it could not be decoded)"
        fields = [{"field": "body", "message": message}]
        return problem(400, "malformed_json", f"body: {message}", fields=fields)
    return problem(exc.status_code, "http_error", str(exc.detail))


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(errors.DispatcherError, _dispatcher_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
