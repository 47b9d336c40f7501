"""What a job produced and holds, read: the job list, its events, metrics, logs, checkpoints, rollouts,
predictions and allocations. Reads only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, TypeVar

import sqlalchemy as sa

from scheduler.db.models import (
    Allocation,
    Checkpoint,
    Job,
    JobEvent,
    JobWait,
    LogLine,
    Metric,
    Prediction,
    Rollout,
)
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_for
from scheduler.services.lifecycle import JobServiceBase

RowT = TypeVar("RowT", Checkpoint, Rollout, Prediction, Allocation)

# The columns a job list reads: what a listing shows of a job, not its spec, request and demand (tens of kB of
# JSON each) nor the scheduler's own bookkeeping.
_UNLISTED = frozenset(
    {
        "spec",
        "submitted",
        "demand",
        "nominated_nodes",
        "idempotency_key",
        "service_gpu_s",
        "report_seq",
        "token_claimed_attempt",
        "status_changed_at",
        "queued_at",
        "launched_at",
    }
)
_LISTED_COLUMNS = (
    *(c for c in Job.__table__.columns if c.key not in _UNLISTED),
    JobWait.__table__.c.queue_position,  # a queued job's, from the last pass
    JobWait.__table__.c.wait_reason,
)
_LISTED_FROM = sa.outerjoin(
    Job.__table__, JobWait.__table__, JobWait.__table__.c.job_id == Job.__table__.c.id
)


_LIST_FILTERS: dict[str, Any] = {
    "own_team": lambda c: c.team_id == sa.bindparam("own_team"),
    "team": lambda c: c.team_id == sa.bindparam("team"),
    "statuses": lambda c: c.status.in_(sa.bindparam("statuses", expanding=True)),
    "name": lambda c: c.name == sa.bindparam("name"),
    "queue": lambda c: c.queue == sa.bindparam("queue"),
    "after": lambda c: c.id < sa.bindparam("after"),
}


@cache
def _list_statement(given: frozenset[str]) -> sa.Select[Any]:
    """The job list's statement for a set of filters (parameters named as in `_LIST_FILTERS`, and `limit`),
    built once per set: building one costs more than running it."""
    c = Job.__table__.c
    q = (
        sa.select(*_LISTED_COLUMNS)
        .select_from(_LISTED_FROM)
        .order_by(c.id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    for key, where in _LIST_FILTERS.items():
        if key in given:
            q = q.where(where(c))
    return q


class JobOutputs(JobServiceBase):
    """A job's outputs as its readers see them (take the job from `get`, which checks the caller may see it)."""

    def list(
        self,
        principal: Principal,
        *,
        status: Iterable[str] | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        team: str | None = None,
        queue: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> tuple[list[sa.Row[Any]], str | None]:
        """Newest first; `after` is the id of the last job of the previous page. Rows of what a listing shows
        of each job (columns named as the `Job`'s attributes: `_LISTED_COLUMNS`, not the spec, request and
        demand, tens of kB of JSON each), read without making ORM objects of them."""
        principal.require(Action.JOB_READ)
        params: dict[str, Any] = {"limit": limit + 1}
        if not principal.is_admin:
            params["own_team"] = principal.team_id
        if team:
            params["team"] = team_for(self.session, principal, team).id
        if status:
            params["statuses"] = [s.upper() for s in status]
        if name:
            params["name"] = name
        if queue:
            params["queue"] = queue
        if after:
            params["after"] = after
        q = _list_statement(frozenset(params))
        if name_contains:
            q = q.where(Job.__table__.c.name.contains(name_contains, autoescape=True))
        rows = list(self.session.execute(q, params))
        next_cursor = rows[limit - 1].id if len(rows) > limit else None
        return rows[:limit], next_cursor

    def events(self, job: Job) -> list[JobEvent]:
        return list(
            self.session.scalars(sa.select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id))
        )

    def metrics(
        self, job: Job, *, names: Sequence[str] | None = None, since_step: int | None = None
    ) -> list[Metric]:
        q = sa.select(Metric).where(Metric.job_id == job.id).order_by(Metric.name, Metric.step, Metric.id)
        if names:
            q = q.where(Metric.name.in_(list(names)))
        if since_step is not None:
            q = q.where(Metric.step >= since_step)
        return list(self.session.scalars(q))

    def logs(self, job: Job, *, after: int = 0, limit: int = 1000, tail: int | None = None) -> list[LogLine]:
        """Lines after the line with id `after`, oldest first; with `tail`, the last `tail` lines."""
        q = sa.select(LogLine).where(LogLine.job_id == job.id, LogLine.id > after)
        if tail is not None:
            rows = list(self.session.scalars(q.order_by(LogLine.id.desc()).limit(tail)))
            return rows[::-1]
        return list(self.session.scalars(q.order_by(LogLine.id).limit(limit)))

    def checkpoints(self, job: Job) -> list[Checkpoint]:
        return self._rows_of(job, Checkpoint, Checkpoint.step, Checkpoint.id)

    def rollouts(self, job: Job) -> list[Rollout]:
        return self._rows_of(job, Rollout, Rollout.rollout_id, Rollout.id)

    def predictions(self, job: Job) -> list[Prediction]:
        return self._rows_of(job, Prediction, Prediction.step, Prediction.id)

    def allocations(self, job: Job) -> list[Allocation]:
        return self._rows_of(job, Allocation)

    def _rows_of(self, job: Job, model: type[RowT], *order: Any) -> list[RowT]:
        """Every `model` row of `job`, in `order` (none: the database's)."""
        return list(self.session.scalars(sa.select(model).where(model.job_id == job.id).order_by(*order)))
