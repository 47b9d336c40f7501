"""Job credentials: the one-time bootstrap secret a launch hands to a driver, and the attempt's bearer
token the driver exchanges it for.

- The launcher puts only `bootstrap_secret(job, attempt)` (`rjb_…`) in the Ray job's environment, which
  Ray's Jobs API shows to anyone who can reach the cluster's dashboard.
- The driver's first call, `POST /v1/internal/jobs/{id}/token` with the bootstrap secret as bearer,
  claims the attempt: `jobs.token_claimed_attempt` is set to it by compare-and-set, so exactly one
  exchange per attempt succeeds, and gets `job_token(job, attempt)` (`rjt_…`), which the driver keeps in
  memory only. A second exchange for the same attempt is refused (409) and recorded in the job's events
  as a reuse: someone other than the driver holds the bootstrap secret.
- A token authorizes only while its attempt is the job's live attempt (status STARTING, RUNNING,
  PREEMPTING or CANCELLING, `jobs.attempt` equal to the token's attempt, and that attempt claimed): after
  the attempt ends (a terminal status, or a requeue after preemption) it is refused like a wrong one.

Both are HMACs of (purpose, job id, attempt) under the platform's signing key: any API replica verifies
them without a table, a re-delivered launch of the same attempt hands out the same bootstrap secret, and
attempts never repeat (each launch increments `jobs.attempt`), so neither is ever valid twice. The attempt
is written in clear inside both (`rjt_<attempt>_<mac>`) so that a check needs no lookup before the
MAC is verified. Every refusal is the same 401 (`job_credential_error`), whether the job does not exist,
the token is wrong or belongs to another job, or its attempt has ended: the job is looked up whatever
the MAC says and the answer never branches on what the lookup found.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Job, JobEvent
from scheduler.domain.errors import Unauthenticated
from scheduler.domain.jobs import ON_CLUSTER

JOB_TOKEN_PREFIX = "rjt_"
BOOTSTRAP_PREFIX = "rjb_"
# Purposes inside the MAC: a bootstrap secret is never a token, nor is a token of the earlier
# format (`rjt_` + HMAC(job:attempt), once in Ray jobs' environments) one of this format.
_TOKEN_PURPOSE = "job-token/v2"
_BOOTSTRAP_PURPOSE = "job-bootstrap/v1"
_SHAPE = re.compile(r"^(rjt|rjb)_(\d{1,9})_([0-9a-f]{64})$")
LIVE = frozenset(ON_CLUSTER)  # the statuses in which an attempt's driver may run


def _mac(signing_key: bytes, purpose: str, job_id: str, attempt: int) -> str:
    return hmac.new(signing_key, f"{purpose}:{job_id}:{attempt}".encode(), hashlib.sha256).hexdigest()


def job_token(signing_key: bytes, job_id: str, attempt: int) -> str:
    """The bearer token of one attempt of one job. Handed out only by `claim_job_token`."""
    return f"{JOB_TOKEN_PREFIX}{attempt}_{_mac(signing_key, _TOKEN_PURPOSE, job_id, attempt)}"


def bootstrap_secret(signing_key: bytes, job_id: str, attempt: int) -> str:
    """The one-time secret the launcher gives a driver (in its Ray job's environment)."""
    return f"{BOOTSTRAP_PREFIX}{attempt}_{_mac(signing_key, _BOOTSTRAP_PURPOSE, job_id, attempt)}"


def _signed_attempt(
    signing_key: bytes, prefix: str, purpose: str, job_id: str, raw: str | None
) -> int | None:
    """The attempt a credential of `job_id` names when its MAC is right; None otherwise."""
    match = _SHAPE.match(raw or "")
    # Compare against something of the right length even for garbage, so that a malformed credential
    # costs the same MAC computation as a well-formed wrong one.
    attempt = int(match.group(2)) if match else 0
    expected = _mac(signing_key, purpose, job_id, attempt)
    given = match.group(3) if match else "0" * 64
    ok = hmac.compare_digest(expected, given)
    if not (match and ok and raw is not None and raw.startswith(prefix)):
        return None
    return attempt


def job_credential_error() -> Unauthenticated:
    """The one answer to every bad job credential (no such job, wrong token, another job's token, an
    attempt that ended, a used or wrong bootstrap secret): nothing in it depends on which."""
    return Unauthenticated(
        "invalid or expired job credential",
        code="job.bad_token",
        details={"hint": "a job's token is valid only for its driver's live attempt"},
    )


def _live(job: Job | None, attempt: int | None) -> bool:
    return job is not None and attempt is not None and job.attempt == attempt and job.status in LIVE


def authorize_job_token(session: Session, signing_key: bytes, job_id: str, token: str | None) -> Job:
    """The job whose live, claimed attempt `token` belongs to; `job_credential_error()` otherwise."""
    attempt = _signed_attempt(signing_key, JOB_TOKEN_PREFIX, _TOKEN_PURPOSE, job_id, token)
    job = session.get(Job, job_id)  # looked up whatever the MAC said; the answer never says which failed
    if not (_live(job, attempt) and job is not None and job.token_claimed_attempt == attempt):
        raise job_credential_error()
    assert job is not None
    return job


def claim_job_token(
    session: Session, signing_key: bytes, job_id: str, bootstrap: str | None
) -> tuple[Job, str | None]:
    """Exchange an attempt's bootstrap secret for its token, once: (job, token) the first time, (job, None)
    on any later exchange for that attempt (recorded in the job's events as a reuse; the caller answers
    409 and commits that record). `job_credential_error()` for a wrong secret or an attempt not live."""
    attempt = _signed_attempt(signing_key, BOOTSTRAP_PREFIX, _BOOTSTRAP_PURPOSE, job_id, bootstrap)
    job = session.get(Job, job_id)
    if not _live(job, attempt):
        raise job_credential_error()
    assert job is not None and attempt is not None
    claimed = session.execute(
        sa.update(Job)
        .where(
            Job.id == job_id,
            Job.attempt == attempt,
            Job.status.in_(list(LIVE)),
            sa.or_(Job.token_claimed_attempt.is_(None), Job.token_claimed_attempt != attempt),
        )
        .values(token_claimed_attempt=attempt)
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    if claimed.rowcount == 1:
        session.add(
            JobEvent(
                job_id=job.id,
                kind="token_claimed",
                reason=f"the driver of attempt {attempt} exchanged its bootstrap secret for the attempt's token",
            )
        )
        session.flush()
        return job, job_token(signing_key, job_id, attempt)
    if job.token_claimed_attempt == attempt and _live(job, attempt):
        session.add(
            JobEvent(
                job_id=job.id,
                kind="bootstrap_reused",
                reason=(
                    f"bootstrap secret reused: a second exchange for attempt {attempt} was refused; "
                    "someone other than the driver holds the attempt's bootstrap secret"
                ),
            )
        )
        session.flush()
        return job, None
    raise job_credential_error()  # the attempt ended between the check and the claim
