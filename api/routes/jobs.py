"""Routes for submitting, watching and cancelling jobs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import (
    AuditDep,
    BearerDep,
    DatabaseDep,
    DispatcherDep,
    JobServiceDep,
    PrincipalDep,
    ReadJobServiceDep,
    SettingsDep,
    finish_units_of_work,
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
from scheduler.db.models import BIGINT_MAX, INTEGER_MAX, INTEGER_MIN
from scheduler.dispatch import Dispatcher
from scheduler.domain.errors import DomainError, NotFound
from scheduler.domain.jobs import JobStatus
from scheduler.services.audit import AuditEntry
from scheduler.services.auth import Principal, authenticate
from scheduler.services.jobs import JobService, Submission
from scheduler.transactions import after_commit

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)


def _detail(svc: JobService, job, *, new: bool = False) -> JobDetail:  # type: ignore[no-untyped-def]
    detail = JobDetail.model_validate(job, from_attributes=True)
    if not new:  # a job created by this request holds nothing yet
        detail.allocations = [
            {"node": a.node, "role": a.role, "gpus": a.gpus, "pool": a.pool} for a in svc.allocations(job)
        ]
    return detail


# The busiest routes (submit, list; the dry run in specs.py) are `async def` doing their work in one trip to
# the thread pool: a plain `def` route costs a second trip, FastAPI validating its answer there. They end their
# units of work in that trip too (`finish_units_of_work`): their dependencies would take one more.
@router.post("", status_code=201, response_model=JobDetail)
async def submit_job(
    request: Request,
    body: JobCreate,
    reader: ReadJobServiceDep,
    svc: JobServiceDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
    response: Response,
    audit: AuditDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobDetail:
    """Submit a job (the key's team, or `team` for an admin) to one of the team's queues at a priority
    class the team was granted. The spec is judged with reads only, then the job is written in a short
    transaction (`JobService.judge`)."""
    return await run_in_threadpool(
        _submit, request, body, reader, svc, principal, dispatcher, response, audit, idempotency_key
    )


def _submit(
    request: Request,
    body: JobCreate,
    reader: JobService,
    svc: JobService,
    principal: Principal,
    dispatcher: Dispatcher,
    response: Response,
    audit: AuditEntry,
    idempotency_key: str | None,
) -> JobDetail:
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
    job, created = svc.submit(principal, sub, judged)
    audit.note(
        target=job.id, name=job.name, queue=job.queue, priority_class=job.priority_class, created=created
    )
    if created:
        after_commit(svc.session, dispatcher.request_pass)
    else:
        response.status_code = 200
    detail = _detail(svc, job, new=created)
    finish_units_of_work(request, response.status_code)
    return detail


@router.get("", response_model=JobsPage)
async def list_jobs(
    request: Request,
    svc: JobServiceDep,
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
def get_job(job_id: str, svc: JobServiceDep, principal: PrincipalDep) -> JobDetail:
    return _detail(svc, svc.get(job_id, principal))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic)
def cancel_job(
    job_id: str, svc: JobServiceDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> JobPublic:
    job = svc.cancel(job_id, principal)
    if job.status == JobStatus.CANCELLING:
        after_commit(svc.session, lambda: dispatcher.stop(job.id, job.pool))
    else:
        after_commit(svc.session, dispatcher.request_pass)
    return JobPublic.model_validate(job)


@router.get("/{job_id}/events", response_model=JobEventsPage)
def job_events(job_id: str, svc: JobServiceDep, principal: PrincipalDep) -> JobEventsPage:
    job = svc.get(job_id, principal)
    return JobEventsPage(data=[JobEventPublic.model_validate(e) for e in svc.events(job)])


@router.get("/{job_id}/metrics", response_model=JobMetrics)
def job_metrics(
    job_id: str,
    svc: JobServiceDep,
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
    svc: JobServiceDep,
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
def job_checkpoints(job_id: str, svc: JobServiceDep, principal: PrincipalDep) -> CheckpointsPage:
    job = svc.get(job_id, principal)
    return CheckpointsPage(data=[CheckpointPublic.model_validate(c) for c in svc.checkpoints(job)])


@router.get("/{job_id}/rollouts", response_model=RolloutsPage)
def job_rollouts(job_id: str, svc: JobServiceDep, principal: PrincipalDep) -> RolloutsPage:
    job = svc.get(job_id, principal)
    return RolloutsPage(data=[RolloutPublic.model_validate(r) for r in svc.rollouts(job)])


@router.get("/{job_id}/predictions", response_model=PredictionsPage)
def job_predictions(job_id: str, svc: JobServiceDep, principal: PrincipalDep) -> PredictionsPage:
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
    svc: JobServiceDep,
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


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-sent events."}},
)
async def stream_job(
    job_id: str,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    token: BearerDep,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[
        str | None,
        Query(max_length=200, description="Resume from an event id seen before (as Last-Event-ID)."),
    ] = None,
) -> StreamingResponse:
    """Server-sent events: `status` on every change, then `event`, `metric`, `log`, `checkpoint`,
    `rollout` and `prediction` as they arrive; `end` after the job reaches a terminal status. Every
    message carries an `id:`; reconnect with `Last-Event-ID` (or `?after=`) to resume without replay.
    The key is checked on every poll: a key revoked or expired meanwhile ends the stream (a reconnect
    gets the 401)."""
    cursor = _parse_cursor(after or last_event_id)

    def poll(cur: dict[str, int]) -> tuple[list[tuple[str, dict]], bool]:
        with db.session(read_only=True) as s:
            svc = JobService(s, artifact_root=settings.artifacts)
            job = svc.get(job_id, authenticate(s, token))
            out: list[tuple[str, dict]] = []
            status_key = hash((job.status, job.progress_step, job.updated_at))
            if status_key != cur.get("status"):
                cur["status"] = status_key
                out.append(("status", JobPublic.model_validate(job).model_dump(mode="json")))
            for e in svc.events(job):
                if e.id > cur["e"]:
                    cur["e"] = e.id
                    out.append(("event", JobEventPublic.model_validate(e).model_dump(mode="json")))
            for m in svc.metrics_after(job, after=cur["m"]):
                cur["m"] = m.id
                out.append(
                    (
                        "metric",
                        {
                            "name": m.name,
                            "step": m.step,
                            "value": m.value,
                            "time": m.time.isoformat(),
                            "attempt": m.attempt,
                        },
                    )
                )
            for line in svc.logs(job, after=cur["l"], limit=500):
                cur["l"] = line.id
                out.append(("log", LogLinePublic.model_validate(line).model_dump(mode="json")))
            for kind, key, rows, model in (
                ("checkpoint", "c", svc.checkpoints(job), CheckpointPublic),
                ("rollout", "r", svc.rollouts(job), RolloutPublic),
                ("prediction", "p", svc.predictions(job), PredictionPublic),
            ):
                for row in rows:
                    if row.id > cur[key]:
                        cur[key] = max(cur[key], row.id)
                        out.append((kind, model.model_validate(row).model_dump(mode="json")))
            return out, JobStatus(job.status).is_terminal()

    # Check access before the stream starts, so that a wrong id is a 404 and not an empty stream.
    await run_in_threadpool(lambda: poll(dict.fromkeys(_CURSOR_KEYS, 1 << 62)))

    async def gen() -> AsyncIterator[bytes]:
        quiet = 0
        while True:
            try:
                items, done = await run_in_threadpool(poll, cursor)
            except DomainError:  # the key was revoked or expired, or the job went away
                return
            for kind, data in items:
                yield f"id: {_format_cursor(cursor)}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()
            if done:
                yield f"id: {_format_cursor(cursor)}\nevent: end\ndata: {{}}\n\n".encode()
                return
            quiet = 0 if items else quiet + 1
            if quiet and quiet % 30 == 0:
                yield b": keep-alive\n\n"
            if await request.is_disconnected():
                return
            await asyncio.sleep(0.5)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# A stream position: the last id seen of events, metrics, logs, checkpoints, rollouts, predictions.
_CURSOR_KEYS = ("e", "m", "l", "c", "r", "p")


def _parse_cursor(text: str | None) -> dict[str, int]:
    cursor = dict.fromkeys(_CURSOR_KEYS, 0)
    for part in (text or "")[:200].split("."):
        digits = part[1:]
        if part[:1] in cursor and digits.isascii() and digits.isdigit() and int(digits) <= BIGINT_MAX:
            cursor[part[0]] = int(digits)
    return cursor


def _format_cursor(cursor: dict[str, int]) -> str:
    return ".".join(f"{k}{cursor[k]}" for k in _CURSOR_KEYS)
