"""Request dependencies as typed aliases: settings, the unit of work, the caller, services."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request, Response
from sqlalchemy.orm import Session

from api.audit import audit_entry, record_with_change
from scheduler.db.engine import Database
from scheduler.dispatch import Dispatcher
from scheduler.domain.roles import Action
from scheduler.services.audit import AuditEntry
from scheduler.services.auth import Principal, authenticate, find_api_key, principal_for_key
from scheduler.services.jobs import JobService
from scheduler.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_db)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]


def get_session(db: DatabaseDep, request: Request, response: Response) -> Iterator[Session]:
    """The request's unit of work: committed when the route returns, before the response is sent.
    GET requests read only. A mutating call's audit row is written in it (api/audit.py)."""
    with db.session(read_only=request.method in ("GET", "HEAD")) as session:
        yield session
        record_with_change(request, session, response.status_code)
    request.state.audit_written = audit_entry(request) is not None


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_read_session(db: DatabaseDep) -> Iterator[Session]:
    """A read-only unit of work for what a mutating request reads before it writes, or instead: the dry
    run, and the judging of a submission's spec (`JobService.judge`). On SQLite it takes no write lock, so
    a long judgement does not stop other writers (a 120,000-key spec held the lock for 71 s)."""
    with db.session(read_only=True) as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(get_read_session, scope="function")]


def bearer(authorization: Annotated[str | None, Header()] = None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


BearerDep = Annotated[str | None, Depends(bearer)]


def get_principal(request: Request, db: DatabaseDep, token: BearerDep) -> Principal:
    """The caller, looked up in a read-only unit of work of its own: a mutating request's unit of work
    (`SessionDep`, on SQLite the write lock) begins only when its route first uses it."""
    with db.session(read_only=True) as session:
        key = find_api_key(session, token)
    entry = audit_entry(request)
    if key is not None and entry is not None:  # who called, even when the key is refused below
        entry.caller(key.id, key.role, key.team_id)
    return principal_for_key(key, presented=bool(token))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_audit(request: Request) -> AuditEntry:
    """The audit entry of this call, for the route to name its target and note safe details (a read
    gets a throwaway entry)."""
    return audit_entry(request) or AuditEntry(method=request.method, path=request.url.path)


AuditDep = Annotated[AuditEntry, Depends(get_audit)]


def require_metrics_reader(settings: SettingsDep, db: DatabaseDep, token: BearerDep) -> None:
    """/metrics: the scrapers' RELAX_METRICS_TOKEN, or a key whose role may read metrics (admin)."""
    expected = settings.api.metrics_token
    if expected and token and hmac.compare_digest(token.encode(), expected.encode()):
        return
    with db.session(read_only=True) as session:
        authenticate(session, token).require(Action.METRICS_READ)


MetricsReaderDep = Annotated[None, Depends(require_metrics_reader)]


def get_job_service(session: SessionDep, settings: SettingsDep) -> JobService:
    return JobService(session, artifact_root=settings.artifacts, home=settings.home)


JobServiceDep = Annotated[JobService, Depends(get_job_service)]


def get_read_job_service(session: ReadSessionDep, settings: SettingsDep) -> JobService:
    return JobService(session, artifact_root=settings.artifacts, home=settings.home)


ReadJobServiceDep = Annotated[JobService, Depends(get_read_job_service)]
