"""Routes for job drivers on the clusters: fetch the spec, send reports (job-scoped tokens)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import BearerDep, JobServiceDep, SettingsDep
from api.schemas import ERROR_RESPONSES
from api.schemas.jobs import ReportAck, ReportCreate
from scheduler.db.models import Job
from scheduler.domain.errors import Unauthenticated
from scheduler.services.auth import verify_job_token
from scheduler.services.jobs import Report

router = APIRouter(prefix="/v1/internal/jobs", tags=["internal"], responses=ERROR_RESPONSES)


def _authorized_job(svc, settings, job_id: str, token: str | None) -> Job:  # type: ignore[no-untyped-def]
    job = svc.get(job_id)
    if not verify_job_token(settings.signing_key(), job.id, job.attempt, token):
        raise Unauthenticated("invalid job token for this job and attempt", code="job.bad_token")
    return job


@router.get("/{job_id}/spec")
def driver_spec(job_id: str, svc: JobServiceDep, settings: SettingsDep, token: BearerDep) -> dict[str, Any]:
    job = _authorized_job(svc, settings, job_id, token)
    return {
        "job_id": job.id,
        "name": job.name,
        "attempt": job.attempt,
        "spec": svc.driver_spec(job),
        "output_dir": job.output_dir,
    }


@router.post("/{job_id}/report", response_model=ReportAck)
def driver_report(
    job_id: str, body: ReportCreate, svc: JobServiceDep, settings: SettingsDep, token: BearerDep
) -> ReportAck:
    job = _authorized_job(svc, settings, job_id, token)
    stop = svc.ingest_report(job, Report(**body.model_dump()))
    return ReportAck(stop_requested=stop)
