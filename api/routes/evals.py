"""Routes of CI evals: run one, list them (a model's history), read one (docs/reference/evals.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from api.deps import AuditDep, DispatcherDep, PrincipalDep, ReadSessionDep, SessionDep
from api.schemas import ERROR_RESPONSES
from api.schemas.evals import EvalCreate, EvalModelPublic, EvalPublic, EvalsPage, ThresholdIn
from scheduler.db.models import Eval
from scheduler.domain.evals import EvalOutcome
from scheduler.domain.jobs import JobStatus
from scheduler.services import evals
from scheduler.services.eval_verdicts import Threshold
from scheduler.transactions import after_commit

router = APIRouter(prefix="/v1/evals", tags=["evals"], responses=ERROR_RESPONSES)


@router.post("", status_code=201, response_model=EvalPublic)
def create_eval(
    body: EvalCreate,
    request: Request,
    session: SessionDep,
    read_session: ReadSessionDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
    audit: AuditDep,
) -> EvalPublic:
    """Evaluate a model on eval sets (Relax's eval semantics) against thresholds on their metrics. It runs as a
    high-priority eval-only job through the queue; the eval ends passed, failed (a threshold does not hold) or
    error (its job failed). A threshold on a metric the eval will not produce is refused, naming it."""
    audit.note(team=body.team, queue=body.queue, priority_class=body.priority_class, name=body.name)
    state = request.app.state
    req = evals.EvalRequest(
        model_job=body.model.job,
        checkpoint_step=body.model.checkpoint_step,
        model_path=body.model.path,
        thresholds=[
            Threshold(t.metric, t.op, t.value) if isinstance(t, ThresholdIn) else t for t in body.thresholds
        ],
        eval_prompt_data=body.eval_prompt_data,
        eval_config=body.eval_config,
        n_samples_per_eval_prompt=body.n_samples_per_eval_prompt,
        pass_at_k=body.pass_at_k,
        spec=body.spec,
        name=body.name,
        team=body.team,
        queue=body.queue,
        priority_class=body.priority_class,
        labels=dict(body.labels or {}),
    )
    # checked and judged in a read-only unit of work (SQLite: no write lock meanwhile), then written
    ev, job = evals.create_eval(
        session,
        principal,
        req,
        artifact_root=state.artifact_root,
        home=state.settings.home,
        read_session=read_session,
    )
    audit.note(target=ev.id, job=job.id, team=ev.team_id, model=ev.model_key)
    after_commit(session, dispatcher.request_pass)
    return _public(ev, job.status)


@router.get("", response_model=EvalsPage)
def list_evals(
    session: SessionDep,
    principal: PrincipalDep,
    model: Annotated[
        str | None, Query(max_length=300, description="One model's history: its model_key.")
    ] = None,
    outcome: EvalOutcome | None = None,
    team: Annotated[str | None, Query(description="Admins: only this team's (name or id).")] = None,
    after: Annotated[
        str | None, Query(max_length=40, description="Id of the last eval of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> EvalsPage:
    """The team's evals, newest first (an admin: every team's)."""
    rows, cursor = evals.list_evals(
        session, principal, team=team, model=model, outcome=outcome, after=after, limit=limit
    )
    return EvalsPage(data=[_public(ev, job_status) for ev, job_status in rows], next_cursor=cursor)


@router.get("/{eval_id}", response_model=EvalPublic)
def get_eval(eval_id: str, session: SessionDep, principal: PrincipalDep) -> EvalPublic:
    """An eval: its model, eval sets, each threshold with its verdict, the metrics, and its job."""
    ev, job_status = evals.get_eval(session, principal, eval_id)
    return _public(ev, job_status)


def _public(ev: Eval, job_status: JobStatus | None) -> EvalPublic:
    return EvalPublic(
        id=ev.id,
        name=ev.name,
        team_id=ev.team_id,
        job_id=ev.job_id,
        job_status=job_status,
        outcome=EvalOutcome(ev.outcome),
        reason=ev.reason,
        model=EvalModelPublic.model_validate(ev.model),
        model_key=ev.model_key,
        datasets=ev.datasets,  # type: ignore[arg-type]
        thresholds=ev.thresholds,  # type: ignore[arg-type]
        metric_values=ev.metric_values or {},
        expected_metrics=ev.expected_metrics,
        created_at=ev.created_at,
        finished_at=ev.finished_at,
        created_by=ev.created_by,
    )
