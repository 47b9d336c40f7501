"""One JSON error envelope for every failure: {"error": {code, message, details, request_id}}."""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.deps import refused_before_route
from jobspec.issues import SpecIssue
from runtime.redaction import redact, redact_value
from scheduler.domain.errors import DomainError, request_issue

log = logging.getLogger(__name__)


def envelope(request: Request, status: int, code: str, message: str, details: Any = None) -> JSONResponse:
    """The error body. Its message and details never echo a secret that came with the request (an API key,
    a job token or bootstrap secret, an Authorization value): they pass through the log redaction."""
    request_id = redact_value(getattr(request.state, "request_id", None))  # a client-chosen X-Request-ID
    message, details = redact(message), redact_value(details)
    request.state.error_code = code  # for the audit row of a refused call (api/audit.py)
    return JSONResponse(
        status_code=status,
        content={"error": {"code": code, "message": message, "details": details, "request_id": request_id}},
        headers={"X-Request-ID": request_id} if request_id else None,
    )


def _field_of(loc: tuple[Any, ...]) -> str:
    """The field an error names, without where it came from (a path parameter may be called `path`)."""
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


async def _domain_error(request: Request, exc: DomainError) -> JSONResponse:
    return envelope(request, exc.status_code, exc.code, exc.message, exc.details)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    try:  # a route that looks its caller up itself: the caller first, as a dependency would have (api/deps.py)
        await run_in_threadpool(refused_before_route, request)
    except DomainError as refused:
        return await _domain_error(request, refused)
    issues = [
        request_issue(
            SpecIssue("request.invalid", _field_of(tuple(e.get("loc", ()))), e.get("msg", ""), _hint(e))
        )
        for e in exc.errors()
    ]
    first = issues[0] if issues else {"field": "body", "message": "invalid request"}
    return envelope(
        request, 422, "request.invalid", f"{first['field']}: {first['message']}", {"issues": issues}
    )


def _hint(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "remove this field; see the schema at /openapi.json"
    if kind == "missing":
        return "this field is required"
    return "see the schema at /openapi.json"


async def _integrity_error(request: Request, exc: sqlalchemy.exc.IntegrityError) -> JSONResponse:
    return envelope(request, 409, "conflict", "the change conflicts with existing data")


#: What a 503 tells the client to wait before it retries (seconds): the database or the broker being away.
RETRY_AFTER_SECONDS = 5
UNAVAILABLE = "service.unavailable"
# SQLite's OperationalErrors that mean "not now" rather than a mistake in a statement ("no such table").
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "unable to open database", "disk i/o")


def unavailable_service(exc: BaseException) -> str | None:
    """`database` or `broker` when `exc` means that service cannot be reached (down, restarting, its
    connections cut, its pool exhausted); None for any other failure, which stays a 500."""
    if isinstance(exc, sqlalchemy.exc.TimeoutError):  # no connection free in the pool in time
        return "database"
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and not isinstance(exc, sqlalchemy.exc.IntegrityError):
        if exc.connection_invalidated:  # SQLAlchemy saw the connection die
            return "database"
        if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            if type(exc.orig).__module__.startswith("sqlite3"):
                return "database" if any(m in str(exc.orig).lower() for m in _SQLITE_TRANSIENT) else None
            # psycopg (PostgreSQL): OperationalError/InterfaceError are the server or the connection
            # (refused, reset, closed, shutting down, cancelled); a wrong statement is ProgrammingError.
            return "database"
        return None
    if isinstance(exc, kombu.exceptions.OperationalError):  # Celery could not publish: no broker
        return "broker"
    return None


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 `service.unavailable` naming the service, with Retry-After, for a database or broker that went
    away (docs/reliability.md, "Crash trials and outages"); any other error of those kinds is a 500."""
    service = unavailable_service(exc)
    if service is None:
        return await _unexpected(request, exc)
    log.warning(
        "503: the %s is unavailable (request %s): %s",
        service,
        getattr(request.state, "request_id", None),
        redact(f"{type(exc).__name__}: {exc}".splitlines()[0])[:300],
    )
    response = envelope(
        request,
        503,
        UNAVAILABLE,
        f"the {service} is unavailable; retry in a few seconds",
        {"service": service},
    )
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {
        400: "request.malformed",  # a body that is not JSON (or not UTF-8) where JSON is expected
        404: "not_found",
        405: "method_not_allowed",
        401: "unauthenticated",
    }.get(exc.status_code, "http_error")
    return envelope(request, exc.status_code, code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error (request %s)", getattr(request.state, "request_id", None))
    return envelope(request, 500, "internal", "internal error; quote the request_id when reporting it")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _domain_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(sqlalchemy.exc.IntegrityError, _integrity_error)  # type: ignore[arg-type]
    # the database or the broker away: 503 (other errors of these classes fall through to a 500)
    for cls in (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.TimeoutError, kombu.exceptions.OperationalError):
        app.add_exception_handler(cls, _unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
