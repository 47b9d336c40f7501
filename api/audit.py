"""The audit log's HTTP side: which calls are recorded, and when each row is written.

Every POST, PUT, PATCH and DELETE under /v1 — except the drivers' /v1/internal routes, which are
high-volume and carry job tokens, not people's keys (they record their anomalies themselves) — writes one
`audit_events` row:

- when the route returns, in the request's own unit of work (`api/deps.py::get_session`), so the row
  commits with the change or not at all;
- otherwise (refused: 401, 403, 404, 409, 422; or failed: 500), by the middleware below, in a
  transaction of its own after the request's has rolled back, before the answer is sent.

The row names the caller's key, role and team (also for a revoked or expired key), the route template,
the target (the path's ids, or the id the call created) and details a route chose to note (names,
queue, role — never a body, a spec or a secret), plus the error code of a refusal.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.services.audit import AuditEntry, record

log = logging.getLogger(__name__)

AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_audited(method: str, path: str) -> bool:
    return method in AUDITED_METHODS and path.startswith("/v1/") and not path.startswith("/v1/internal/")


def audit_entry(request: Request) -> AuditEntry | None:
    """The entry of an audited request, None for others (reads)."""
    return getattr(request.state, "audit", None)


def _complete(request: Request, entry: AuditEntry) -> AuditEntry:
    route = request.scope.get("route")
    entry.path = getattr(route, "path", None) or request.url.path[:200]
    rid = getattr(request.state, "request_id", None)
    entry.request_id = rid[:64] if rid else None  # a client's X-Request-ID may be longer than the column
    if entry.target is None:
        params = request.scope.get("path_params") or {}
        entry.target = "/".join(str(v) for v in params.values()) or None
    return entry


def entry_for_change(request: Request) -> AuditEntry | None:
    """The entry of an audited request with its route and request id, for a service that writes its row in
    the statement of the change itself (`JobSubmission.submit(audit=...)`: a round trip less); the route then
    calls `written_with_change`. None for a request that is not audited."""
    entry = audit_entry(request)
    return _complete(request, entry) if entry is not None else None


def written_with_change(request: Request) -> None:
    """The row of this call is in its unit of work already (`entry_for_change`): `record_with_change` writes
    none. If that unit of work does not commit, the middleware writes the row alone, as for any failure."""
    request.state.audit_with_change = True


def record_with_change(request: Request, session: Session, status_code: int | None) -> None:
    """Write the row of a call whose route returned, in the request's unit of work. The status is the
    route's (or the one it set on `Response`): an audited route refuses by raising, never by returning
    an error response itself."""
    entry = audit_entry(request)
    if entry is None or getattr(request.state, "audit_with_change", False):
        return
    route = request.scope.get("route")
    status = status_code or getattr(route, "status_code", None) or 200
    record(session, _complete(request, entry), status)


def _record_alone(request: Request, status_code: int) -> None:
    entry = _complete(request, audit_entry(request) or AuditEntry(request.method, request.url.path))
    code = getattr(request.state, "error_code", None)
    if code:
        entry.details["error"] = code
    try:
        with request.app.state.db.session() as session:
            record(session, entry, status_code)
    except Exception:  # the answer stands; a lost row is logged under the request id
        log.exception("audit row not written (request %s)", entry.request_id)


class AuditMutations:
    """ASGI middleware: an audited call's entry in `request.state.audit` for the request to fill, and its row
    written here unless the request's unit of work wrote it: when the answer starts (its status known, before
    any of it reaches the client), or for an unhandled error, as a 500 (the outermost middleware answers it).
    A plain ASGI middleware rather than `@app.middleware("http")`, which runs every request, audited or not,
    through a task group and memory streams."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_audited(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request.state.audit = AuditEntry(method=request.method, path=request.url.path)

        async def send_after_recording(message: Message) -> None:
            if message["type"] == "http.response.start" and not getattr(
                request.state, "audit_written", False
            ):
                request.state.audit_written = True
                await run_in_threadpool(_record_alone, request, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_after_recording)
        except Exception:  # unhandled: the outermost middleware answers 500
            if not getattr(request.state, "audit_written", False):
                request.state.audit_written = True
                await run_in_threadpool(_record_alone, request, 500)
            raise


def install_audit(app: FastAPI) -> None:
    app.add_middleware(AuditMutations)
