"""Request dependencies as typed aliases: settings, the unit of work, the caller, services."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Header, Request, Response
from sqlalchemy.orm import Session

from api.audit import audit_entry, record_with_change
from scheduler.db.engine import Database
from scheduler.dispatch import Dispatcher
from scheduler.domain.roles import Action
from scheduler.logs import annotate
from scheduler.services.audit import AuditEntry
from scheduler.services.auth import Principal, authenticate, find_api_key, principal_for_key
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.outputs import JobOutputs
from scheduler.services.reports import JobReports
from scheduler.services.submission import JobSubmission
from scheduler.settings import Settings


# Dependencies that do no I/O are `async def`: FastAPI runs them on the event loop. A plain `def` one
# would cost a hop to the thread pool and back on every request (a submission resolves a dozen).
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_db(request: Request) -> Database:
    return request.app.state.db


async def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_db)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]


async def _in_thread(fn: Callable[..., object], *args: object) -> None:
    """Finish a unit of work (commit or roll back, close) in a worker thread, shielded from cancellation and
    outside the thread pool's limit: as FastAPI does for a generator dependency's exit, so that a request
    waiting for a thread never keeps another from giving back its database connection."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(fn, *args, limiter=anyio.CapacityLimiter(1))


def _finish(session: Session, request: Request | None = None, status_code: int | None = None) -> None:
    try:
        if request is not None:
            record_with_change(request, session, status_code)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _discard(session: Session) -> None:
    try:
        session.rollback()
    finally:
        session.close()


def _units_of_work(request: Request) -> asyncio.Semaphore:
    """How many requests of this process may hold a unit of work at once: as many as there are threads to
    run them (RELAX_API_THREADS). A unit of work holds its database connection from its first statement
    (the caller's key, `get_principal`) to its end, across trips to the thread pool; without this bound, more
    requests than threads could each hold a connection while waiting for a thread, the pool run dry, and the
    threads then wait for connections: no request would move until the pool's timeout. One semaphore per
    event loop (a test client runs each request on a loop of its own)."""
    loop = asyncio.get_running_loop()
    per_loop = request.app.state.units_of_work  # a WeakKeyDictionary (api/app.py)
    slots = per_loop.get(loop)
    if slots is None:
        slots = per_loop[loop] = asyncio.Semaphore(request.app.state.settings.api.api_threads)
    return slots


@asynccontextmanager
async def _ended_after(
    request: Request, session: Session, audited: Response | None = None
) -> AsyncIterator[None]:
    """End `session` in a worker thread once the request is done with it, unless the route ended it already
    (`finish_units_of_work`): rolled back if the request failed, else committed, with the audit row of a
    mutating call when `audited` (the response, for its status code) is given."""
    try:
        yield
    except BaseException:
        if not getattr(request.state, "units_finished", False):
            await _in_thread(_discard, session)
        raise
    if not getattr(request.state, "units_finished", False):
        if audited is None:
            await _in_thread(_finish, session)
        else:
            await _in_thread(_finish, session, request, audited.status_code)


# The units of work are async generators: making a session does no I/O, so it happens on the event loop,
# and only its end (the commit, or the rollback) goes to a thread. (A plain generator costs a trip to the
# thread pool at each end.)
# The dependencies every request resolves take the app's state from `request` rather than through the
# dependencies above: each dependency FastAPI resolves costs CPU on every request.
@asynccontextmanager
async def unit_of_work(request: Request, response: Response) -> AsyncIterator[Session]:
    """The request's unit of work: committed when the route returns, before the response is sent.
    GET requests read only. A mutating call's audit row is written in it (api/audit.py). A route that does
    its work in the thread pool ends it there (`finish_units_of_work`), sparing a trip. `get_session` as a
    context manager, for a route that opens it itself (`POST /v1/jobs`: a dependency FastAPI resolves costs
    CPU on every request)."""
    async with _units_of_work(request):
        session = request.app.state.db.new_session(read_only=request.method in ("GET", "HEAD"))
        request.state.unit_of_work = session
        async with _ended_after(request, session, audited=response):
            yield session
    request.state.audit_written = audit_entry(request) is not None


async def get_session(request: Request, response: Response) -> AsyncIterator[Session]:
    """The request's unit of work (`unit_of_work`) as a dependency."""
    async with unit_of_work(request, response) as session:
        yield session


def finish_units_of_work(request: Request, status_code: int | None = None) -> None:
    """End the request's units of work now, in this (worker) thread, as their dependencies would after the
    route: the read-only one (`get_read_session`, SQLite) first, then the request's own, with the audit row of
    a mutating call (`status_code`: the one the route set on `Response`, if any). For routes that do their work
    in one trip to the thread pool, as their last step: the dependencies then have nothing left to do there
    (a trip less). On failure the exception propagates as the route's own: everything is rolled back."""
    request.state.units_finished = True
    read_session = getattr(request.state, "read_unit_of_work", None)
    session = getattr(request.state, "unit_of_work", None)
    try:
        if read_session is not None:
            _finish(read_session)
    except BaseException:
        if session is not None:
            _discard(session)
        raise
    if session is not None:
        _finish(session, request, status_code)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


async def get_read_session(request: Request, session: SessionDep) -> AsyncIterator[Session]:
    """A unit of work that only reads, for what a mutating request reads before it writes, or instead: the
    dry run, and the judging of a submission's spec (`JobSubmission.judge`). On SQLite a read-only one of its
    own, which takes no write lock, so a long judgement does not stop other writers (a 120,000-key spec held
    the lock for 71 s). Where a transaction locks only the rows it writes (PostgreSQL), the request's own
    unit of work: one transaction instead of two, and `JobSubmission.submit` reads nothing again."""
    db: Database = request.app.state.db
    if not db.single_writer:
        yield session
        return
    read_session = db.new_session(read_only=True)
    request.state.read_unit_of_work = read_session
    async with _ended_after(request, read_session):
        yield read_session


ReadSessionDep = Annotated[Session, Depends(get_read_session, scope="function")]


def bearer_token(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` value."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


async def bearer(authorization: Annotated[str | None, Header()] = None) -> str | None:
    return bearer_token(authorization)


BearerDep = Annotated[str | None, Depends(bearer)]


def get_principal(request: Request, token: BearerDep, session: SessionDep) -> Principal:
    """The caller. On SQLite looked up in a read-only unit of work of its own: a mutating request's unit of
    work (`SessionDep`, there the write lock) begins only when its route first uses it. Elsewhere in the
    request's own unit of work, whose first read it is (a transaction of its own would cost three more round
    trips to the database). Never cached: a key revoked or expired is refused by the next request."""
    return principal_of(request, token, session)


def principal_of(request: Request, token: str | None, session: Session) -> Principal:
    """`get_principal`'s lookup, for a route that makes it in its own trip to the thread pool (a trip less:
    `POST /v1/jobs`), marked `caller_in_route`."""
    db: Database = request.app.state.db
    if db.single_writer:
        with db.session(read_only=True) as read_session:
            key = find_api_key(read_session, token)
    else:
        key = find_api_key(session, token)
    entry = audit_entry(request)
    if key is not None and entry is not None:  # who called, even when the key is refused below
        entry.caller(key.id, key.role, key.team_id)
    if key is not None:
        annotate(team=key.team_id)  # the request's log lines name the caller's team (scheduler/logs.py)
    return principal_for_key(key, presented=bool(token))


PrincipalDep = Annotated[Principal, Depends(get_principal)]

_CALLER_IN_ROUTE = "relax_caller_in_route"


def caller_in_route(endpoint: Callable[..., object]) -> Callable[..., object]:
    """Mark a route that looks its caller up itself (`principal_of`) instead of through `PrincipalDep`. A
    request refused before such a route runs (its body or a header invalid: 422) is then answered as if the
    dependency had run first: `refused_before_route` looks the caller up, so that a call without a valid key
    is still a 401, and its audit row still names the key."""
    setattr(endpoint, _CALLER_IN_ROUTE, True)
    return endpoint


def refused_before_route(request: Request) -> None:
    """For a `caller_in_route` route's request refused before the route ran (in a worker thread): the caller's
    key looked up and noted on the call's audit entry; `Unauthenticated` (401) raised where `PrincipalDep`
    would have raised it. Nothing for other routes."""
    if not getattr(request.scope.get("endpoint"), _CALLER_IN_ROUTE, False):
        return
    with request.app.state.db.session(read_only=True) as session:
        principal_of(request, bearer_token(request.headers.get("authorization")), session)


async def get_audit(request: Request) -> AuditEntry:
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


# The job services, one a concern (scheduler/services/: submission, lifecycle, reports, outputs): a route takes
# the one it needs.
async def get_job_submission(session: SessionDep, request: Request) -> JobSubmission:
    state = request.app.state
    return JobSubmission(session, artifact_root=state.artifact_root, home=state.settings.home)


JobSubmissionDep = Annotated[JobSubmission, Depends(get_job_submission)]


async def get_read_job_submission(session: ReadSessionDep, request: Request) -> JobSubmission:
    """Judging a submission and the dry run: reads only (`ReadSessionDep`)."""
    state = request.app.state
    return JobSubmission(session, artifact_root=state.artifact_root, home=state.settings.home)


ReadJobSubmissionDep = Annotated[JobSubmission, Depends(get_read_job_submission)]


def submission_services(request: Request, session: Session) -> tuple[JobSubmission, JobSubmission]:
    """(the reader, the writer): what `ReadJobSubmissionDep` and `JobSubmissionDep` give, made in a route's own
    trip to the thread pool instead (each dependency FastAPI resolves costs CPU on every request: the submit
    route's answer rate is set by it). On SQLite the reader has a read-only unit of work of its own, ended by
    `finish_units_of_work`; a route that fails before it must call `discard_read_unit_of_work`."""
    state = request.app.state
    read_session = session
    if state.db.single_writer:
        read_session = request.state.read_unit_of_work = state.db.new_session(read_only=True)
    root, home = state.artifact_root, state.settings.home
    return (
        JobSubmission(read_session, artifact_root=root, home=home),
        JobSubmission(session, artifact_root=root, home=home),
    )


def discard_read_unit_of_work(request: Request) -> None:
    """Roll back and close a reader's unit of work made by `submission_services` (a failed route; in its thread)."""
    read_session = getattr(request.state, "read_unit_of_work", None)
    if read_session is not None and not getattr(request.state, "units_finished", False):
        request.state.read_unit_of_work = None
        _discard(read_session)


async def get_job_lifecycle(session: SessionDep) -> JobLifecycle:
    return JobLifecycle(session)


JobLifecycleDep = Annotated[JobLifecycle, Depends(get_job_lifecycle)]


async def get_job_reports(session: SessionDep, request: Request) -> JobReports:
    state = request.app.state
    return JobReports(session, artifact_root=state.artifact_root, home=state.settings.home)


JobReportsDep = Annotated[JobReports, Depends(get_job_reports)]


async def get_job_outputs(session: SessionDep) -> JobOutputs:
    return JobOutputs(session)


JobOutputsDep = Annotated[JobOutputs, Depends(get_job_outputs)]
