"""Routes for submitting, watching and cancelling jobs."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy.orm import Session
from starlette._exception_handler import wrap_app_handling_exceptions
from starlette.concurrency import run_in_threadpool

from api.audit import audit_entry, entry_for_change, written_with_change
from api.deps import (
    BearerDep,
    DatabaseDep,
    DispatcherDep,
    JobLifecycleDep,
    JobOutputsDep,
    PrincipalDep,
    bearer_token,
    caller_in_route,
    discard_read_unit_of_work,
    finish_units_of_work,
    principal_of,
    submission_services,
    unit_of_work,
)
from api.schemas import ERROR_RESPONSES
from api.schemas.jobs import (
    CheckpointPublic,
    CheckpointsPage,
    JobCreate,
    JobDetail,
    JobEventPublic,
    JobEventsPage,
    JobMetrics,
    JobPublic,
    JobsPage,
    LogLinePublic,
    LogsPage,
    MetricPoint,
    PredictionPublic,
    PredictionsPage,
    RolloutPublic,
    RolloutsPage,
)
from jobspec.bounds import MAX_PATH_LENGTH
from scheduler.db.engine import defer_begin
from scheduler.db.models import BIGINT_MAX, INTEGER_MAX, INTEGER_MIN, Job
from scheduler.dispatch import Dispatcher
from scheduler.domain.errors import DomainError, NotFound
from scheduler.domain.jobs import JobStatus
from scheduler.services.audit import AuditEntry
from scheduler.services.auth import Principal, authenticate
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.outputs import JobOutputs
from scheduler.services.stream import MAX_ID_LENGTH, JobStream, StreamCursor
from scheduler.services.submission import JobSubmission, Submission
from scheduler.transactions import after_commit

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)


# JobDetail's fields read from the job row (`allocations` come from their own rows, `spec` is written apart)
_DETAIL_COLUMNS = tuple(n for n in JobDetail.model_fields if n not in ("spec", "allocations"))
_DETAIL_SERIALIZER = JobDetail.__pydantic_serializer__


def _detail(svc: JobOutputs, job, *, new: bool = False, status_code: int = 200) -> Response:  # type: ignore[no-untyped-def]
    """The job as `JobDetail` JSON, written here rather than by FastAPI. The spec (every parameter, ~1,000
    values) is written once, as it stands, by pydantic-core: validated into the model it would be copied, and
    FastAPI validates and copies an answer again before writing it — together a tenth of a submission's API
    CPU (py-spy, `bench.api_load`). The rest of the job is validated as the response model says."""
    head: dict[str, Any] = {n: getattr(job, n) for n in _DETAIL_COLUMNS}
    head["spec"] = {}
    if not new:  # a job created by this request holds nothing yet
        head["allocations"] = [
            {
                "node": a.node,
                "role": a.role,
                "gpus": a.gpus,
                "pool": a.pool,
                "releasing": a.released_in is not None,
            }
            for a in svc.allocations(job)
        ]
    others = _DETAIL_SERIALIZER.to_json(JobDetail.model_validate(head), exclude={"spec"})
    spec = to_json(job.spec)
    return Response(
        content=b"".join((others[:-1], b',"spec":', spec, b"}")),
        status_code=status_code,
        media_type="application/json",
    )


# The busiest routes (submit, list; the dry run in specs.py) are `async def` doing their work in one trip to
# the thread pool: a plain `def` route costs a second trip, FastAPI validating its answer there. They end their
# units of work in that trip too (`finish_units_of_work`): their dependencies would take one more. The submit
# route also looks its caller up and makes its services in that trip (`principal_of`, `submission_services`),
# and opens its unit of work itself (`unit_of_work`): each dependency FastAPI resolves, and a sync one's own
# trip, cost CPU on every submission.
@router.post("", status_code=201, response_model=JobDetail)
@caller_in_route
async def submit_job(
    request: Request,
    body: JobCreate,
    token: BearerDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Submit a job (the key's team, or `team` for an admin) to one of the team's queues at a priority
    class the team was granted. The spec is judged with reads only, then the job is written in a short
    transaction (`JobSubmission.judge`)."""
    async with unit_of_work(request, response) as session:
        return await run_in_threadpool(_submit, request, body, token, session, response, idempotency_key)


def _submit(
    request: Request,
    body: JobCreate,
    token: str | None,
    session: Session,
    response: Response,
    idempotency_key: str | None,
) -> Response:
    try:
        # PostgreSQL: the reads (the key, the platform's small tables) go without a transaction, and the job's one
        # statement commits itself: no BEGIN and no COMMIT, two round trips of five (`defer_begin`)
        defer_begin(session)
        principal = principal_of(request, token, session)
        reader, svc = submission_services(request, session)
        detail = _submitted(request, body, principal, reader, svc, response, idempotency_key)
    except BaseException:
        discard_read_unit_of_work(request)
        raise
    finish_units_of_work(request, response.status_code)
    return detail


def _submitted(
    request: Request,
    body: JobCreate,
    principal: Principal,
    reader: JobSubmission,
    svc: JobSubmission,
    response: Response,
    idempotency_key: str | None,
) -> Response:
    audit = audit_entry(request) or AuditEntry(method=request.method, path=request.url.path)
    audit.note(name=body.name, team=body.team, queue=body.queue, priority_class=body.priority_class)
    sub = Submission(
        name=body.name,
        team=body.team,
        queue=body.queue,
        priority_class=body.priority_class,
        labels=body.labels,
        spec=body.spec,
        args=body.args,
        idempotency_key=idempotency_key,
        launch_script=body.launch_script.model_dump() if body.launch_script else None,
    )
    judged = reader.judge(principal, sub)
    # a job created has the call's audit row written in its own statement (noted by the service)
    entry = entry_for_change(request)
    job, created = svc.submit(principal, sub, judged, audit=entry, audit_status=201)
    if created:
        if entry is not None:
            written_with_change(request)
        after_commit(svc.session, request.app.state.dispatcher.request_pass)
    else:
        audit.note(
            target=job.id, name=job.name, queue=job.queue, priority_class=job.priority_class, created=False
        )
        response.status_code = 200
    return _detail(JobOutputs(svc.session), job, new=created, status_code=201 if created else 200)


@router.get("", response_model=JobsPage)
async def list_jobs(
    request: Request,
    svc: JobOutputsDep,
    principal: PrincipalDep,
    status: Annotated[list[str] | None, Query(description="Repeat or comma-separate.")] = None,
    name: str | None = None,
    team: str | None = None,
    queue: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobsPage:
    statuses = [s for item in status or [] for s in item.split(",") if s]

    def page() -> JobsPage:
        rows, cursor = svc.list(
            principal, status=statuses, name=name, team=team, queue=queue, after=after, limit=limit
        )
        # from plain dicts: reading a Row's values as attributes costs 3x the validation
        out = JobsPage(
            data=[JobPublic.model_validate(dict(zip(r._fields, r, strict=True))) for r in rows],
            next_cursor=cursor,
        )
        finish_units_of_work(request)
        return out

    return await run_in_threadpool(page)


@router.get("/{job_id}", response_model=JobDetail)
def get_job(job_id: str, svc: JobOutputsDep, principal: PrincipalDep) -> Response:
    return _detail(svc, svc.get(job_id, principal))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic)
def cancel_job(
    job_id: str, svc: JobLifecycleDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> JobPublic:
    return JobPublic.model_validate(cancel(svc, dispatcher, job_id, principal))


def cancel(svc: JobLifecycle, dispatcher: Dispatcher, job_id: str, principal: Principal) -> Job:
    """Cancel the job; once committed, its Ray job is stopped (a job on the cluster) or a pass frees its place
    (one that was not). The routes that cancel a job (this one, `POST /v1/fine_tuning/jobs/{id}/cancel`) share it."""
    job = svc.cancel(job_id, principal)
    if job.status == JobStatus.CANCELLING:
        after_commit(svc.session, lambda: dispatcher.stop(job.id, job.pool))
    else:
        after_commit(svc.session, dispatcher.request_pass)
    return job


@router.get("/{job_id}/events", response_model=JobEventsPage)
def job_events(job_id: str, svc: JobOutputsDep, principal: PrincipalDep) -> JobEventsPage:
    job = svc.get(job_id, principal)
    return JobEventsPage(data=[JobEventPublic.model_validate(e) for e in svc.events(job)])


@router.get("/{job_id}/metrics", response_model=JobMetrics)
def job_metrics(
    job_id: str,
    svc: JobOutputsDep,
    principal: PrincipalDep,
    names: Annotated[list[str] | None, Query(description="Metric names; repeat or comma-separate.")] = None,
    since_step: Annotated[int | None, Query(ge=INTEGER_MIN, le=INTEGER_MAX)] = None,
) -> JobMetrics:
    job = svc.get(job_id, principal)
    wanted = [n for item in names or [] for n in item.split(",") if n]
    series: dict[str, list[MetricPoint]] = {}
    for m in svc.metrics(job, names=wanted, since_step=since_step):
        series.setdefault(m.name, []).append(
            MetricPoint(step=m.step, value=m.value, time=m.time, attempt=m.attempt)
        )
    return JobMetrics(job_id=job.id, series=series)


@router.get("/{job_id}/logs", response_model=LogsPage)
def job_logs(
    job_id: str,
    svc: JobOutputsDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=BIGINT_MAX, description="Id of the last line already seen.")] = 0,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    tail: Annotated[int | None, Query(ge=1, le=10000, description="Only the last N lines.")] = None,
) -> LogsPage:
    job = svc.get(job_id, principal)
    lines = svc.logs(job, after=after, limit=limit, tail=tail)
    return LogsPage(
        data=[LogLinePublic.model_validate(line) for line in lines],
        next_after=lines[-1].id if lines else after,
    )


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPage)
def job_checkpoints(job_id: str, svc: JobOutputsDep, principal: PrincipalDep) -> CheckpointsPage:
    job = svc.get(job_id, principal)
    return CheckpointsPage(data=[CheckpointPublic.model_validate(c) for c in svc.checkpoints(job)])


@router.get("/{job_id}/rollouts", response_model=RolloutsPage)
def job_rollouts(job_id: str, svc: JobOutputsDep, principal: PrincipalDep) -> RolloutsPage:
    job = svc.get(job_id, principal)
    return RolloutsPage(data=[RolloutPublic.model_validate(r) for r in svc.rollouts(job)])


@router.get("/{job_id}/predictions", response_model=PredictionsPage)
def job_predictions(job_id: str, svc: JobOutputsDep, principal: PrincipalDep) -> PredictionsPage:
    """SFT predictions files (`<save>/predict/predictions_step_<id>.jsonl`): prompt, reference, completion."""
    job = svc.get(job_id, principal)
    return PredictionsPage(data=[PredictionPublic.model_validate(p) for p in svc.predictions(job)])


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=FileResponse,
    responses={200: {"content": {"*/*": {}}, "description": "The file (its type guessed from its name)."}},
)
def download_artifact(
    job_id: str,
    path: Annotated[str, PathParam(max_length=MAX_PATH_LENGTH)],
    svc: JobOutputsDep,
    principal: PrincipalDep,
) -> FileResponse:
    """A file under the job's output directory (checkpoint shards, rollout records, exports)."""
    job = svc.get(job_id, principal)
    root = Path(job.output_dir).resolve()
    missing = NotFound(f"no file {path!r} in the outputs of job {job_id}", code="artifact.not_found")
    try:
        target = (root / path).resolve()
        if root not in target.parents or not target.is_file():
            raise missing
    except OSError:  # a name longer than the file system's NAME_MAX, a loop of links: no such file either
        raise missing from None
    return FileResponse(target, filename=target.name)


#: The kinds of rows a stream sends (scheduler/services/stream.py SOURCES).
StreamKind = Literal["event", "metric", "log", "checkpoint", "rollout", "prediction"]


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-sent events."}},
)
async def stream_job(
    job_id: str,
    request: Request,
    db: DatabaseDep,
    principal: PrincipalDep,
    token: BearerDep,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[
        str | None,
        Query(
            max_length=MAX_ID_LENGTH,
            description="Resume after a message's id (as Last-Event-ID, which it overrides).",
        ),
    ] = None,
    kinds: Annotated[
        list[StreamKind] | None,
        Query(description="Only these kinds of rows (repeat the parameter); `status` and `end` always come."),
    ] = None,
) -> StreamingResponse:
    """Server-sent events: `status` (the job's `JobPublic` fields) first and on every change,
    then every `event` (each state change is one), `metric`, `log`, `checkpoint`, `rollout` and
    `prediction` row of the job, each once, oldest first per kind; `end` once the job is terminal and
    every row of it was sent. Every message but `end` carries its own `id:`
    (`e<id>.m<id>.l<id>.c<id>.r<id>.p<id>.s<token>`, the position after it); reconnect with
    `Last-Event-ID` (or `?after=`) to resume after that message without gaps or repeats.
    The key is checked on every poll: a key revoked or expired meanwhile ends the stream (a reconnect
    gets the 401)."""
    cursor = StreamCursor.parse(after or last_event_id)
    stream = JobStream(cursor, kinds=frozenset(kinds) if kinds else None)

    def poll() -> tuple[list[bytes], bool, bool]:
        """One poll's messages, whether every source was read to its end, whether the stream ends."""
        with db.session(read_only=True) as s:
            job = JobOutputs(s).get(job_id, authenticate(s, token))
            found = stream.poll(s, job)
            out: list[bytes] = []
            if found.status is not None:
                out.append(
                    _sse(cursor, "status", JobPublic.model_validate(found.status).model_dump(mode="json"))
                )
            for kind, key, row in found.rows:
                cursor.positions[key] = row.id
                out.append(_sse(cursor, kind, _STREAM_PAYLOADS[kind](row)))
            return out, found.drained, found.ended

    # Check access before the stream starts, so that a wrong id is a 404 and not an empty stream.
    await run_in_threadpool(_check_access, db, job_id, token)

    async def gen() -> AsyncIterator[bytes]:
        quiet = 0
        while True:
            try:
                messages, drained, ended = await anyio.to_thread.run_sync(poll, limiter=_stream_limiter())
            except DomainError:  # the key was revoked or expired, or the job went away
                return
            if messages:
                yield b"".join(messages)
            if ended:
                yield b"event: end\ndata: {}\n\n"
                return
            if await request.is_disconnected():
                return
            if not drained:  # a backlog: read on at once
                continue
            quiet = 0 if messages else quiet + 1
            if quiet and quiet % 30 == 0:
                yield b": keep-alive\n\n"
            await asyncio.sleep(STREAM_POLL_S)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


#: Seconds between a stream's polls once it has sent everything there was.
STREAM_POLL_S = 0.5
#: Threads that run streams' polls at once, apart from the threads of requests (RELAX_API_THREADS): however
#: many subscribers there are, other requests never wait behind their polls.
STREAM_THREADS = 4
_STREAM_LIMITERS: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


def _stream_limiter() -> anyio.CapacityLimiter:
    """The limiter of streams' polls of the running event loop (a limiter belongs to one loop)."""
    loop = asyncio.get_running_loop()
    limiter = _STREAM_LIMITERS.get(loop)
    if limiter is None:
        limiter = _STREAM_LIMITERS[loop] = anyio.CapacityLimiter(STREAM_THREADS)
    return limiter


def _check_access(db, job_id: str, token: str) -> None:  # type: ignore[no-untyped-def]
    with db.session(read_only=True) as s:
        JobOutputs(s).get(job_id, authenticate(s, token))


def _sse(cursor: StreamCursor, kind: str, data: dict) -> bytes:  # type: ignore[type-arg]
    return f"id: {cursor.format()}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _metric_payload(m) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return {
        "id": m.id,
        "name": m.name,
        "step": m.step,
        "value": m.value,
        "time": m.time.isoformat(),
        "attempt": m.attempt,
    }


# What each kind of row is sent as: the same fields as the kind's read endpoint.
_STREAM_PAYLOADS = {
    "event": lambda row: JobEventPublic.model_validate(row).model_dump(mode="json"),
    "metric": _metric_payload,
    "log": lambda row: LogLinePublic.model_validate(row).model_dump(mode="json"),
    "checkpoint": lambda row: CheckpointPublic.model_validate(row).model_dump(mode="json"),
    "rollout": lambda row: RolloutPublic.model_validate(row).model_dump(mode="json"),
    "prediction": lambda row: PredictionPublic.model_validate(row).model_dump(mode="json"),
}


# -- POST /v1/jobs without FastAPI's request handler ---------------------------------------------------------
# FastAPI's handler for a route parses the body's content type (email.message), reads the body, resolves and
# validates every parameter (`solve_dependencies`) and opens two exit stacks: ~a tenth of a submission's API
# instructions (callgrind, `bench.api_cpu`). For the plain case — a JSON body that is a valid `JobCreate` and
# an Idempotency-Key within its bound — the route is called here with what FastAPI would have given it; any
# other request (a refused body, another content type, a long key) goes to FastAPI's handler unchanged, so
# every refusal keeps its status, shape and field names. The route, its OpenAPI entry and its exception
# handling (the app's handlers, as FastAPI's handler applies them) stay the same.
_IDEMPOTENCY_KEY_MAX = 200  # as `submit_job`'s Header(max_length=200)


def _fast_submit_app(handler: Any) -> Any:
    """`handler` (FastAPI's ASGI app for `POST /v1/jobs`) with the fast path in front of it."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        fields = _fast_fields(scope, body)
        if fields is None:
            await handler(scope, _replayed(body, receive), send)
            return
        request = Request(scope, _replayed(body, receive), send)

        async def run(scope: dict[str, Any], receive: Any, send: Any) -> None:
            response = Response()  # as FastAPI's `Response` parameter: no status until the route sets one
            answer = await submit_job(request, *fields[:2], response, fields[2])
            await answer(scope, receive, send)

        await wrap_app_handling_exceptions(run, request)(scope, request.receive, send)

    return app


def _fast_fields(scope: dict[str, Any], body: bytes) -> tuple[JobCreate, str | None, str | None] | None:
    """(body, bearer token, idempotency key) as FastAPI would resolve them for `submit_job`, or None where
    FastAPI's handler must judge the request (anything it could refuse or read otherwise)."""
    content_type = authorization = key = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            if content_type is not None:
                return None
            content_type = value
        elif name == b"authorization":
            if authorization is None:
                authorization = value.decode("latin-1")
        elif name == b"idempotency-key":
            if key is not None:
                return None
            key = value.decode("latin-1")
    if content_type != b"application/json" or not body:
        return None
    if key is not None and len(key) > _IDEMPOTENCY_KEY_MAX:
        return None
    try:
        parsed = JobCreate.model_validate(json.loads(body))
    except (ValueError, ValidationError):  # JSON or validation errors: FastAPI's handler words them
        return None
    return parsed, bearer_token(authorization), key


def _replayed(body: bytes, then: Any) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


def install_submit_fast_path(app: Any) -> bool:
    """Put the fast path in front of FastAPI's handler of `POST /v1/jobs` in `app` (after its routers are
    included). False where the route was not found as expected (then nothing changes)."""
    from fastapi.routing import _IncludedRouter  # FastAPI's per-inclusion route contexts

    for candidate in app.router.routes:
        if not isinstance(candidate, _IncludedRouter) or candidate.original_router is not router:
            continue
        for context in candidate.effective_route_contexts():
            route = context.original_route
            if getattr(route, "endpoint", None) is submit_job and context.app is not None:
                context.app = _fast_submit_app(context.app)
                return True
    return False
