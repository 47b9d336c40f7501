"""Request dependencies as typed aliases: settings, the unit of work, the caller, services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from scheduler.db.engine import Database
from scheduler.dispatch import Dispatcher
from scheduler.services.auth import Principal, authenticate
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


def get_session(db: DatabaseDep, request: Request) -> Iterator[Session]:
    """The request's unit of work: committed when the route returns, before the response is sent.
    GET requests read only."""
    with db.session(read_only=request.method in ("GET", "HEAD")) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def bearer(authorization: Annotated[str | None, Header()] = None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


BearerDep = Annotated[str | None, Depends(bearer)]


def get_principal(session: SessionDep, token: BearerDep) -> Principal:
    return authenticate(session, token)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_job_service(session: SessionDep, settings: SettingsDep) -> JobService:
    return JobService(session, artifact_root=settings.artifacts)


JobServiceDep = Annotated[JobService, Depends(get_job_service)]
