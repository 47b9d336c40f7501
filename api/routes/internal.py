"""Routes for job drivers on the clusters: exchange the bootstrap secret for the attempt's token, fetch
the spec, send reports. Design: scheduler/services/job_tokens.py.

The credential is checked in a dependency, before the request body is read and before anything about
the job is answered: every bad credential gets the same 401, whether the job exists or not."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from api.deps import BearerDep, JobReportsDep, SessionDep, SettingsDep
from api.errors import envelope
from api.schemas import ERROR_RESPONSES
from api.schemas.jobs import ReportAck
from runtime.report_protocol import Report
from scheduler.db.models import Job
from scheduler.services.audit import AuditEntry
from scheduler.services.audit import record as record_audit
from scheduler.services.elastic import rollout_grant
from scheduler.services.job_tokens import authorize_job_token, claim_job_token

router = APIRouter(prefix="/v1/internal/jobs", tags=["internal"], responses=ERROR_RESPONSES)


def job_of_token(job_id: str, session: SessionDep, settings: SettingsDep, token: BearerDep) -> Job:
    """The job whose live attempt the bearer token belongs to (401 otherwise, always the same)."""
    return authorize_job_token(session, settings.signing_key(), job_id, token)


TokenJob = Annotated[Job, Depends(job_of_token)]


class JobTokenGrant(BaseModel):
    """The attempt's bearer token: valid while the attempt is live; keep it in memory only."""

    token: str
    attempt: int


@router.post("/{job_id}/token", response_model=JobTokenGrant)
def claim_token(
    job_id: str, request: Request, session: SessionDep, settings: SettingsDep, bootstrap: BearerDep
) -> Any:
    """Once per attempt: the bootstrap secret of the driver's environment (as bearer) for the attempt's
    token. A second exchange is refused with 409 `job.bootstrap_reused` and recorded in the job's events."""
    job, token = claim_job_token(session, settings.signing_key(), job_id, bootstrap)
    if token is None:  # answered without raising, so that the records of the reuse commit
        # for the platform's admins too: a bootstrap secret leaked
        entry = AuditEntry(
            method="POST",
            path="/v1/internal/jobs/{job_id}/token",
            request_id=getattr(request.state, "request_id", None),
            team_id=job.team_id,
            target=job.id,
            details={"error": "job.bootstrap_reused", "attempt": job.attempt},
        )
        record_audit(session, entry, 409)
        return envelope(
            request,
            409,
            "job.bootstrap_reused",
            "this attempt's bootstrap secret was already exchanged",
            {"hint": "a driver exchanges it once, at start; a second exchange means it leaked"},
        )
    return JobTokenGrant(token=token, attempt=job.attempt)


@router.get("/{job_id}/spec")
def driver_spec(job: TokenJob, svc: JobReportsDep) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "name": job.name,
        "attempt": job.attempt,
        "spec": svc.driver_spec(job),
        "output_dir": job.output_dir,
    }


# (an answer names `rollout_engines` only for an elastic job: any other gets `{"stop_requested": ...}` as before)
@router.post("/{job_id}/report", response_model=ReportAck, response_model_exclude_none=True)
def driver_report(job: TokenJob, body: Report, svc: JobReportsDep) -> ReportAck:
    stop = svc.ingest_report(job, body)
    # an elastic job's engines as the pass allocated them: its driver follows them (scheduler/services/elastic.py)
    grant = rollout_grant(svc.session, job)
    if grant is None:
        return ReportAck(stop_requested=stop)
    engines, number = grant
    return ReportAck(stop_requested=stop, rollout_engines=engines, rollout_grant=number)
