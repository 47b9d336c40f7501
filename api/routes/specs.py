"""Routes for validating a job spec without submitting it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.deps import AuditDep, PrincipalDep, ReadJobSubmissionDep, finish_units_of_work
from api.schemas import ERROR_RESPONSES
from api.schemas.jobs import SpecValidate, SpecValidation
from scheduler.services.submission import Submission

router = APIRouter(prefix="/v1/specs", tags=["specs"], responses=ERROR_RESPONSES)


@router.post("/validate", response_model=SpecValidation)
async def validate_spec(
    request: Request, body: SpecValidate, svc: ReadJobSubmissionDep, principal: PrincipalDep, audit: AuditDep
) -> SpecValidation:
    """Dry run: the normalized spec, derived defaults, warnings, errors, resource demand and the
    queue and pool the job would wait in. 200 for any spec; `valid` says whether a submit would pass.
    It only reads (its audit row is written after it, in a short transaction of its own)."""
    audit.note(team=body.team, queue=body.queue)
    sub = Submission(
        spec=body.spec,
        args=body.args,
        queue=body.queue,
        team=body.team,
        launch_script=body.launch_script.model_dump() if body.launch_script else None,
    )

    def dry_run() -> SpecValidation:
        out = SpecValidation(**svc.dry_run(principal, sub))
        finish_units_of_work(request)
        return out

    # one trip to the thread pool (a plain `def` route costs a second: see api/routes/jobs.py)
    return await run_in_threadpool(dry_run)
