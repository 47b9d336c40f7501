"""Routes of OpenAI's fine-tuning jobs (`/v1/fine_tuning/jobs`: create, list, retrieve, cancel, events,
checkpoints; docs/reference/fine-tuning.md). Each is one of the team's jobs (scheduler/services/fine_tuning.py).
Answers and errors are in OpenAI's shapes, so the official `openai` SDK is a client: a refusal is
`{"error": {message, type, param, code}}`, and what the platform answers 422 elsewhere is a 400 here."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.responses import Response

from api.deps import (
    AuditDep,
    DispatcherDep,
    JobLifecycleDep,
    PrincipalDep,
    ReadSessionDep,
    SessionDep,
)
from api.routes import jobs
from api.routes.files import _files
from api.schemas.fine_tuning import (
    OPENAI_ERROR_RESPONSES,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCheckpointsPage,
    FineTuningJobCreate,
    FineTuningJobEvent,
    FineTuningJobEventsPage,
    FineTuningJobsPage,
)
from scheduler.domain.roles import Action
from scheduler.services import fine_tuning as ft
from scheduler.transactions import after_commit

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


def _openai_error(response: Response) -> Response:
    """The platform's error envelope rewritten in OpenAI's shape (the same status, but 400 for a 422)."""
    try:
        body = json.loads(bytes(response.body))
        err = body["error"]
    except (ValueError, KeyError, TypeError):
        return response
    details = err.get("details")
    issues = (
        [i for i in (details.get("issues") or []) if isinstance(i, dict)] if isinstance(details, dict) else []
    )
    # of a value that is neither `auto` nor a number, the number's complaint (pydantic names both members)
    issue = next((i for i in issues if "literal[" not in str(i.get("field"))), issues[0] if issues else {})
    param = _param(issue.get("field"))
    status = 400 if response.status_code == 422 else response.status_code
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    hint = issue.get("hint")
    message = err.get("message") or ""
    if status == 400 and response.status_code == 422 and issue.get("message") and param:
        message = f"{param}: {issue['message']}"
    if hint and hint not in message:
        message = f"{message} ({hint})"
    headers = {
        k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")
    }
    return JSONResponse(
        status_code=status,
        content={
            "error": {
                "message": message,
                "type": kind,
                "param": param,
                "code": err.get("code"),
                "details": details,
                "request_id": err.get("request_id"),
            }
        },
        headers=headers,
    )


_FIELD_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_TYPE_PARTS = frozenset({"int", "float", "str", "bool", "dict", "list"})


def _param(field: object) -> str | None:
    """The request's field as OpenAI's `param` names it: pydantic's member tags (`literal['auto']`, `int`,
    `function-after[...]`) dropped."""
    if not isinstance(field, str) or not field:
        return None
    parts = [p for p in field.split(".") if _FIELD_PART.fullmatch(p) and p not in _TYPE_PARTS]
    return ".".join(parts) or None


class OpenAIRoute(APIRoute):
    """A route whose errors are answered in OpenAI's shape: the app's own handler answers (the audit, the
    request id, Retry-After as on every route), then its body is rewritten (`_openai_error`)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = _app_handler(request, exc)
                if answer is None:
                    raise
                response = await answer(request, exc)
                return _openai_error(response)

        return route


def _app_handler(request: Request, exc: Exception) -> Any:
    handlers = request.app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers and cls is not Exception:
            return handlers[cls]
    if isinstance(exc, RequestValidationError):
        return handlers.get(RequestValidationError)
    return None


router = APIRouter(
    prefix="/v1/fine_tuning/jobs",
    tags=["fine-tuning"],
    responses=OPENAI_ERROR_RESPONSES,
    route_class=OpenAIRoute,
)


def _public(session: Any, job: Any) -> FineTuningJob:
    return FineTuningJob.model_validate(ft.public(session, job))


@router.post("", status_code=200, response_model=FineTuningJob)
def create_fine_tuning_job(
    body: FineTuningJobCreate,
    request: Request,
    session: SessionDep,
    read_session: ReadSessionDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
    audit: AuditDep,
) -> FineTuningJob:
    """Fine-tune a model: `supervised` runs SFT, `reinforcement` GRPO with the grader's reward (string_check,
    text_similarity fuzzy_match), as one of the team's jobs in its queue. The files are checked first: a
    refusal names the field (`training_file`, `method.type`, ...) and writes nothing."""
    method = body.method.model_dump(exclude_none=True) if body.method else None
    audit.note(method=(method or {}).get("type", "supervised"), training_file=body.training_file)
    state = request.app.state
    req = ft.FineTuningRequest(
        model=body.model,
        training_file=body.training_file,
        validation_file=body.validation_file,
        suffix=body.suffix,
        seed=body.seed,
        metadata=dict(body.metadata) if body.metadata else None,
        method=method,
        hyperparameters=body.hyperparameters.model_dump() if body.hyperparameters else None,
        team=body.team,
    )
    job = ft.create_job(
        session,
        principal,
        req,
        files=_files(request, read_session),
        artifact_root=state.artifact_root,
        home=state.settings.home,
        read_session=read_session,
    )
    audit.note(target=job.id, team=job.team_id)
    after_commit(session, dispatcher.request_pass)
    return _public(session, job)


@router.get("", response_model=FineTuningJobsPage)
def list_fine_tuning_jobs(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[
        str | None, Query(max_length=40, description="Id of the last job of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FineTuningJobsPage:
    """The team's fine-tuning jobs, newest first (an admin: every team's). `metadata[KEY]=VALUE` query
    parameters (as the SDK sends `metadata={...}`): only jobs whose metadata holds these pairs."""
    wanted = _metadata_filter(request)
    rows, more = ft.list_jobs(session, principal, after=after, limit=limit, metadata=wanted)
    return FineTuningJobsPage(data=[_public(session, j) for j in rows], has_more=more)


_METADATA_PARAM = re.compile(r"metadata\[([^\]]{1,64})\]")


def _metadata_filter(request: Request) -> dict[str, str] | None:
    wanted = {}
    for key, value in request.query_params.multi_items():
        found = _METADATA_PARAM.fullmatch(key)
        if found is None:
            continue
        if len(wanted) >= 16 or len(value) > 512:
            raise ft.invalid("metadata", "at most 16 pairs, values of 512 characters", "metadata[KEY]=VALUE")
        wanted[found.group(1)] = value
    return wanted or None


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJob)
def retrieve_fine_tuning_job(
    fine_tuning_job_id: str, session: SessionDep, principal: PrincipalDep
) -> FineTuningJob:
    return _public(session, ft.get_job(session, principal, fine_tuning_job_id))


@router.post("/{fine_tuning_job_id}/cancel", status_code=200, response_model=FineTuningJob)
def cancel_fine_tuning_job(
    fine_tuning_job_id: str,
    svc: JobLifecycleDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
    audit: AuditDep,
) -> FineTuningJob:
    """Cancel the job (as `POST /v1/jobs/{id}/cancel`): `cancelled` at once, its run stopped."""
    session = svc.session
    principal.require(Action.JOB_CANCEL)  # the role first: it names no job
    ft.get_job(session, principal, fine_tuning_job_id)
    job = jobs.cancel(svc, dispatcher, fine_tuning_job_id, principal)
    audit.note(target=job.id, team=job.team_id)
    session.refresh(job)
    return _public(session, job)


@router.get("/{fine_tuning_job_id}/events", response_model=FineTuningJobEventsPage)
def list_fine_tuning_events(
    fine_tuning_job_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[str | None, Query(max_length=60, description="Id of the last event seen.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> FineTuningJobEventsPage:
    """The job's events, newest first: its state changes and driver events, each step's training loss
    (`type: metrics`), each checkpoint saved."""
    job = ft.get_job(session, principal, fine_tuning_job_id)
    items, more = ft.events(session, job, after=after, limit=limit)
    return FineTuningJobEventsPage(data=[FineTuningJobEvent.model_validate(i) for i in items], has_more=more)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=FineTuningJobCheckpointsPage)
def list_fine_tuning_checkpoints(
    fine_tuning_job_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[str | None, Query(max_length=60, description="Id of the last checkpoint seen.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> FineTuningJobCheckpointsPage:
    """The job's checkpoints, newest first, one per step saved, with the step's metrics."""
    job = ft.get_job(session, principal, fine_tuning_job_id)
    items, more = ft.checkpoints(session, job, after=after, limit=limit)
    data = [FineTuningJobCheckpoint.model_validate(i) for i in items]
    return FineTuningJobCheckpointsPage(
        data=data,
        has_more=more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
