"""Submitting a job: judging a submission (the spec normalized, the queue, class, pool and paths checked,
with reads only), storing it QUEUED, and the dry run that says what submitting would do."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

import jobspec
from jobspec.issues import SpecIssue
from runtime.capabilities import RESTRICTION_HINTS, unsupported_parameters
from scheduler.db.engine import begin_deferred, begin_now
from scheduler.db.jsontext import json_loads
from scheduler.db.models import (
    AuditEvent,
    Job,
    JobEvent,
    Node,
    PathGrant,
    Pool,
    PriorityClass,
    Queue,
    Team,
    WebhookEndpoint,
)
from scheduler.db.spec_column import differing_at_most_in
from scheduler.domain.errors import (
    InvalidRequest,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    request_issue,
)
from scheduler.domain.evals import EVAL_PRIORITY_CLASS
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import JobStatus
from scheduler.domain.roles import Action
from scheduler.logs import annotate
from scheduler.policy.placement import PoolCapacity, gangs_of, place_demand
from scheduler.policy.types import Node as PolicyNode
from scheduler.services import webhooks
from scheduler.services.audit import AuditEntry, row_values
from scheduler.services.auth import Principal, team_for
from scheduler.services.elastic import elastic_demand
from scheduler.services.paths import TeamStorage, resolve_paths, team_storage
from scheduler.services.platform import granted_among, granted_queues
from scheduler.transactions import after_commit

log = logging.getLogger("relax.jobs")

# The submission's statements, built once (building one for each request costs more than running it).
_INSERT_JOB = Job.__table__.insert()
_QUEUE = sa.select(Queue.name, Queue.pool, Queue.team_id).where(Queue.name == sa.bindparam("name"))
_NODES = sa.select(Node.pool, Node.name, Node.gpus)


def _platform_statement() -> sa.CompoundSelect:
    """What a submission and a dry run read of the platform's small tables, in one statement instead of six:
    the queue named (its name, pool and team), every priority class, every node's pool, name and GPUs
    (`_nodes`), the team's path grants of every pool (those of the job's pool are picked from them), its enabled
    webhook endpoints, and the id of the team's job with the submission's idempotency key (none without a key:
    `= NULL` holds for no row). Rows of (kind, a, b, c, n, p)."""
    text, number, flag = (sa.cast(sa.null(), t) for t in (sa.String, sa.Integer, sa.Boolean))

    def kind(k: str) -> sa.ColumnElement[str]:
        return sa.literal_column(f"'{k}'", sa.String).label("kind")

    classes = sa.select(
        kind("c"),
        PriorityClass.name.label("a"),
        text.label("b"),
        text.label("c"),
        PriorityClass.value.label("n"),
        PriorityClass.preemptible.label("p"),
    )
    nodes = sa.select(kind("n"), Node.pool, Node.name, text, Node.gpus, flag)
    grants = sa.select(kind("g"), PathGrant.path, PathGrant.mode, PathGrant.pool, number, flag).where(
        PathGrant.team_id == sa.bindparam("team_id")
    )
    queue = sa.select(kind("q"), Queue.name, Queue.pool, Queue.team_id, number, flag).where(
        Queue.name == sa.bindparam("queue")
    )
    endpoints = sa.select(  # for the job's `job.queued` deliveries (the event types as JSON text)
        kind("w"),
        WebhookEndpoint.id,
        WebhookEndpoint.url,
        sa.cast(WebhookEndpoint.event_types, sa.Text),
        number,
        flag,
    ).where(WebhookEndpoint.team_id == sa.bindparam("team_id"), WebhookEndpoint.disabled.is_(False))
    idempotent = sa.select(
        kind("i"), Job.id, text, text, number, flag
    ).where(  # `uq_jobs_team_idempotency_key`
        Job.team_id == sa.bindparam("team_id"), Job.idempotency_key == sa.bindparam("key")
    )
    return sa.union_all(queue, classes, nodes, grants, endpoints, idempotent)


_PLATFORM = _platform_statement()


@dataclass(frozen=True)
class QueueRow:
    """A queue as a submission reads it."""

    name: str
    pool: str
    team_id: str


@dataclass(frozen=True)
class PoolRef:
    """The pool of a submission's queue: its name is all a submission reads of it (the queue's foreign key
    says it exists)."""

    name: str


@dataclass(frozen=True)
class ClassRow:
    """A priority class as a submission reads it (`_PLATFORM`)."""

    name: str
    value: int
    preemptible: bool


@dataclass(frozen=True)
class PlatformRead:
    """The platform's small tables as one submission reads them, in its unit of work (`_PLATFORM`)."""

    team_id: str
    queue_name: str | None  # the queue read with them, and its row (None: no such queue)
    queue: QueueRow | None
    classes: dict[str, ClassRow]  # by name, in the order read
    nodes: dict[str, list[tuple[str, int]]]  # by pool: (node, GPUs)
    grants: list[tuple[str | None, str, str]]  # (pool, path, mode), ordered by path
    endpoints: webhooks.Endpoints  # the team's enabled webhook endpoints
    idempotency_key: str | None = None  # the key read with them, and the id of its job (None: no such job)
    idempotent_job_id: str | None = None

    def grant_rows(self, pool: str | None) -> list[tuple[str, str]]:
        """The grants that apply in `pool` (its own and every-pool ones; all of them without a pool), as
        `paths.team_storage` reads them."""
        return [(path, mode) for p, path, mode in self.grants if pool is None or p is None or p == pool]


_IDEMPOTENT_JOB = sa.select(Job).where(
    Job.team_id == sa.bindparam("team_id"), Job.idempotency_key == sa.bindparam("key")
)
_INSERT_EVENT = JobEvent.__table__.insert()
_INSERT_AUDIT = AuditEvent.__table__.insert()


@cache
def _job_with_event(event_columns: tuple[str, ...], audited: bool = False) -> sa.Insert:
    """PostgreSQL: a job's row and its event's in one statement (the job's INSERT as a data-modifying WITH of
    the event's: one round trip instead of two, the event's foreign key checked at the statement's end).
    Parameters `job_<column>` and `event_<column>`; `audited`: the call's audit row too, in a second WITH
    (parameters `audit_<column>`; PostgreSQL runs a data-modifying WITH whether or not it is referred to)."""
    jobs, events = Job.__table__, JobEvent.__table__
    new_job = jobs.insert().values({c: sa.bindparam(f"job_{c.key}", type_=c.type) for c in jobs.columns})
    statement = (
        events.insert()
        .values({c: sa.bindparam(f"event_{c}", type_=events.c[c].type) for c in event_columns})
        .add_cte(new_job.cte("new_job"))
    )
    if audited:
        audits = AuditEvent.__table__
        columns = [c for c in audits.columns if c.key != "id"]
        audit = audits.insert().values({c: sa.bindparam(f"audit_{c.key}", type_=c.type) for c in columns})
        statement = statement.add_cte(audit.cte("new_audit"))
    return statement


def _inserted(
    session: Session,
    *,
    event: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
    **given: Any,
) -> Job:
    """A new job row written with one INSERT (no unit-of-work flush), and its `Job` in `session` as if read
    back: every column set (a column not given gets its default, as the ORM would give it), so that nothing
    is loaded again and later changes to it are written as usual. With `event` (a `JobEvent`'s columns but its
    job's id and time, which are the job's id and `created_at`), that event too: on PostgreSQL in the same
    statement (`_job_with_event`), elsewhere in a second one. With `audit` (an `audit_events` row's columns but
    its id: `scheduler.services.audit.row_values`), that row too: on PostgreSQL in the same statement again
    (with `event` only), elsewhere in one more."""
    unknown = set(given) - set(Job.__table__.columns.keys())
    if unknown:
        raise TypeError(f"no job column {sorted(unknown)}")
    values: dict[str, Any] = {}
    for column in Job.__table__.columns:
        if column.key in given:
            values[column.key] = given[column.key]
        elif column.default is None:
            values[column.key] = None
        elif column.default.is_callable:
            values[column.key] = column.default.arg(None)  # type: ignore[attr-defined]
        else:
            values[column.key] = column.default.arg  # type: ignore[attr-defined]
    if event is None:
        session.execute(_INSERT_JOB, values)
    else:
        event = {"job_id": values["id"], "time": values["created_at"], **event}
        if session.get_bind().dialect.name == "postgresql":
            params = {f"job_{k}": v for k, v in values.items()}
            params.update((f"event_{k}", v) for k, v in event.items())
            if audit is not None:
                params.update((f"audit_{k}", v) for k, v in audit.items())
            session.execute(_job_with_event(tuple(event), audit is not None), params)
            audit = None
        else:
            session.execute(_INSERT_JOB, values)
            session.execute(_INSERT_EVENT, event)
    if audit is not None:
        session.execute(_INSERT_AUDIT, audit)
    job = Job(**values)
    make_transient_to_detached(job)
    for name in _WAIT_ATTRIBUTES:  # a new job waits for no pass yet: nothing to read back
        set_committed_value(job, name, None)
    session.add(job)
    return job


_WAIT_ATTRIBUTES = ("queue_position", "wait_reason", "nominated_nodes")  # Job's reading of its JobWait


@dataclass(frozen=True)
class Submission:
    """A validated request to run a job (the API schema converts to this)."""

    name: str | None = None
    team: str | None = None
    queue: str | None = None
    priority_class: str | None = None
    labels: dict[str, str] | None = None
    spec: dict[str, Any] | None = None
    args: Sequence[str] | str | None = None
    idempotency_key: str | None = None
    # Where `args` came from when the client resolved a launch script (provenance; never run here).
    launch_script: dict[str, Any] | None = None
    # An eval's job (services/evals.py): the only submission that may run at the eval class.
    eval_job: bool = False


@dataclass(frozen=True)
class Judged:
    """A submission's spec, judged with reads only (`JobSubmission.judge`): normalizing a spec takes time (a
    large one, seconds), and on SQLite a write transaction holds the database's one write lock meanwhile.
    `submit` takes it when the pool and its node size are still the ones it was judged for.

    Judged in the unit of work that then submits (`session` is `submit`'s own: PostgreSQL, where a
    transaction locks only the rows it writes, see api/deps.py `get_read_session`), nothing it read is read
    again: the same transaction would read the same rows a few milliseconds later."""

    pool: str
    max_gpus_per_node: int | None
    normalized: jobspec.NormalizedSpec
    submitted: dict[str, Any]
    # What it read, when judged in `session` (the team is that session's object, held here since a session
    # keeps only weak references to what it loaded; the rest are plain rows of `_PLATFORM`)
    session: Session | None = field(default=None, compare=False, repr=False)
    objects: tuple[Team, QueueRow, PoolRef, ClassRow] | None = field(default=None, compare=False, repr=False)
    platform: PlatformRead | None = field(default=None, compare=False, repr=False)


class JobSubmission:
    """Judging and storing submissions; what it read of the platform's small tables is kept for the unit of
    work (one read for the queue, the classes, the nodes and the grants: `_read_platform`)."""

    def __init__(self, session: Session, *, artifact_root: Path, home: Path | None = None) -> None:
        self.session = session
        self.artifact_root = artifact_root
        self.home = home  # the platform's home: no job path reaches it (needed to submit)
        self._node_cache: dict[str, list[tuple[str, int]]] | None = None
        self._platform: PlatformRead | None = None

    def judge(self, principal: Principal, sub: Submission) -> Judged | None:
        """What `submit` would check, with reads only, and the normalized spec, for `submit` to take (see
        `Judged`); call it in a read-only unit of work. None when the idempotency key names a job
        already (`submit` answers with it). Raises what `submit` raises for a refused submission."""
        principal.require(Action.JOB_SUBMIT)
        team = team_for(self.session, principal, sub.team)
        if self._idempotent_job(team, sub) is not None:
            return None
        queue = self._queue_for(principal, team, sub.queue)
        pool = PoolRef(queue.pool)
        pclass = self._priority_class(principal, team, sub.priority_class, eval_job=sub.eval_job)
        max_node = self._max_node(pool)
        normalized, submitted = self._normalize_spec(sub, max_node)
        self._refuse_what_cannot_run(normalized, pool)
        return Judged(
            pool.name,
            max_node,
            normalized,
            submitted,
            self.session,
            (team, queue, pool, pclass),
            self._platform,
        )

    def submit(
        self,
        principal: Principal,
        sub: Submission,
        judged: Judged | None = None,
        *,
        audit: AuditEntry | None = None,
        audit_status: int = 201,
    ) -> tuple[Job, bool]:
        """Validate and store a job QUEUED. Returns (job, created); a repeated idempotency key
        returns the original job with created=False. With `judged` (from `judge`, in a unit of work of its
        own before this one) the spec is not normalized again unless its pool changed meanwhile. With `audit`
        (the call's entry, its caller and route known), a job created has it noted (the job as target, its
        name, queue and class, created=True) and its row written with the job's, status `audit_status` (on
        PostgreSQL in the same statement): the caller writes no row of its own then."""
        principal.require(Action.JOB_SUBMIT)
        if judged is not None and judged.session is self.session and judged.objects is not None:
            # judged in this transaction, just before: every check passed here already
            team, queue, pool, pclass = judged.objects
            normalized, submitted = judged.normalized, judged.submitted
            self._platform = judged.platform
        else:
            team = team_for(self.session, principal, sub.team)
            existing = self._idempotent_job(team, sub)
            if existing is not None:
                return existing, False
            queue = self._queue_for(principal, team, sub.queue)
            pool = PoolRef(queue.pool)
            pclass = self._priority_class(principal, team, sub.priority_class, eval_job=sub.eval_job)

            max_node = self._max_node(pool)
            if judged is not None and (judged.pool, judged.max_gpus_per_node) == (pool.name, max_node):
                normalized, submitted = judged.normalized, judged.submitted
            else:
                normalized, submitted = self._normalize_spec(sub, max_node)
            # the backend's refusals depend on the spec alone: none for a spec `judge` passed (~1M instructions)
            backend_judged = judged is not None and normalized is judged.normalized
            self._refuse_what_cannot_run(normalized, pool, backend_judged=backend_judged)
        job_id = new_id("job")
        storage = self._storage(team, pool)
        job_dir = storage.job_dir(job_id)
        resolution = resolve_paths(
            self.session,
            normalized.spec_dict(),
            path_fields=jobspec.path_fields(),
            storage=storage,
            job_dir=job_dir,
        )
        if resolution.issues:
            issues = [request_issue(i) for i in resolution.issues]
            raise InvalidSpec(_summary(issues), details={"issues": issues})
        # the autoscaler's engine bounds (a file the paths above resolved) make the rollout gang elastic
        demand = elastic_demand(normalized.demand.model_dump(mode="json"), resolution.spec, storage)
        name = sub.name or _default_name(resolution.spec)
        if audit is not None:
            audit.note(target=job_id, name=name, queue=queue.name, priority_class=pclass.name, created=True)
        # the stored spec compares only what may differ from the defaults with them: the given and derived fields
        # and the paths resolved (`spec_column.differing_at_most_in`)
        compared = (
            differing_at_most_in(resolution.spec, normalized.changed.union(jobspec.path_fields()))
            if normalized.changed is not None
            else nullcontext()
        )
        endpoints = self._read_platform(team).endpoints  # read with the platform's small tables
        if begin_deferred(self.session) and (endpoints or webhooks.notify_urls(resolution.spec)):
            # deliveries may follow the job's statement (`record_job_transition`): all of it in one transaction
            begin_now(self.session)
        with compared:
            job = _inserted(
                self.session,
                id=job_id,
                name=name,
                team_id=team.id,
                queue=queue.name,
                pool=pool.name,
                status=JobStatus.QUEUED,
                priority_class=pclass.name,
                priority=pclass.value,
                preemptible=pclass.preemptible,
                labels=dict(sub.labels or {}),
                spec=resolution.spec,
                submitted=submitted
                | {
                    "warnings": [w.to_dict() for w in [*normalized.warnings, *resolution.warnings]],
                    "derived": _jsonable(normalized.derived),
                    "inputs": resolution.inputs,
                },
                demand=demand,
                total_gpus=int(demand["total_gpus"]),
                output_dir=str(job_dir),
                idempotency_key=sub.idempotency_key,
                event={
                    "kind": "transition",
                    "from_status": None,
                    "to_status": JobStatus.QUEUED,
                    "reason": f"submitted to queue {queue.name} (pool {pool.name})",
                },
                audit=row_values(audit, audit_status) if audit is not None else None,
            )
        # A unit of work whose statements commit themselves (`defer_begin`: the route's, on PostgreSQL) wrote the
        # job, its event and the call's audit row in that one statement, committed now; anything written after it
        # goes in a transaction again.
        begin_now(self.session)
        annotate(job_id=job_id)  # the request's later lines (its access line) name the new job
        webhooks.record_job_transition(self.session, job, None, endpoints=endpoints)
        after_commit(
            self.session,
            lambda: log.info(
                "submitted to queue %s (pool %s): QUEUED", queue.name, pool.name, extra={"team": team.id}
            ),
        )
        return job, True

    def _idempotent_job(self, team: Team, sub: Submission) -> Job | None:
        """The team's job with the submission's idempotency key, or None. Looked for with the platform's small
        tables when they are read first (`_read_platform`): a round trip less than a statement of its own; the
        job itself is read only when there is one."""
        key = sub.idempotency_key
        if not key:
            return None
        read = self._platform
        if read is None or read.team_id != team.id:
            read = self._read_platform(team, sub.queue, key)
        if read.idempotency_key != key:  # read before for another key
            return self.session.scalar(_IDEMPOTENT_JOB, {"team_id": team.id, "key": key})
        if read.idempotent_job_id is None:
            return None
        return self.session.get(Job, read.idempotent_job_id)

    def dry_run(self, principal: Principal, sub: Submission) -> dict[str, Any]:
        """What submitting would do, without storing anything (it only reads: call it in a read-only unit
        of work): the normalized spec, derived values,
        the resolved argv, warnings, errors, the resource demand, whether the pool can ever hold it,
        and the queue and pool it would wait in.

        Every key is present whatever the outcome. With spec errors, `spec`, `argv`, `derived` and
        `demand` describe what was understood (values that failed are left at their defaults), so a
        user sees which of their flags were read; errors are only under `errors`, warnings only under
        `warnings`."""
        principal.require(Action.JOB_VALIDATE)
        team = team_for(self.session, principal, sub.team)
        queue = self._queue_for(principal, team, sub.queue)
        pool = PoolRef(queue.pool)
        out: dict[str, Any] = {
            "valid": False,
            "queue": queue.name,
            "pool": pool.name,
            "spec": None,
            "argv": None,
            "derived": {},
            "demand": None,
            "capacity": None,
            "warnings": [],
            "errors": [],
        }
        self._read_platform(team)  # the nodes and the team's grants, in one statement
        try:
            normalized, _ = self._normalize_spec(sub, self._max_node(pool))
        except InvalidSpec as err:
            issues = (err.details or {}).get("issues", [])
            errors = [i for i in issues if _is_error(i)]
            out.update(errors=errors, warnings=[i for i in issues if not _is_error(i)])
            known = err.understood
            if known is not None:  # what the rest of the spec says
                out.update(
                    spec=known.spec, argv=known.argv, derived=_jsonable(known.derived), demand=known.demand
                )
                if known.demand is not None:
                    out["capacity"] = self._capacity(pool, known.demand)
                # What the platform cannot run is known without a valid spec; the backend is the one
                # refusal worth reporting now (the rest would repeat whatever the errors are about).
                named = {f for e in errors for f in e.get("fields") or [e.get("field")]}
                if "train-backend" not in named:
                    out["errors"] += [
                        i for i in backend_refusals(known.spec) if i["field"] == "train-backend"
                    ]
            return out
        demand = normalized.demand.model_dump(mode="json")
        capacity = self._capacity(pool, demand)
        refused = backend_refusals(normalized.spec_dict(), normalized.changed) + _unschedulable(
            capacity, demand
        )
        storage = self._storage(team, pool)
        resolution = resolve_paths(
            self.session,
            normalized.spec_dict(),
            path_fields=jobspec.path_fields(),
            storage=storage,
            job_dir=storage.job_dir("<job-id>"),
        )
        errors = refused + [i.to_dict() for i in resolution.issues]
        if not resolution.issues:
            try:  # the rollout's engine bounds, as a submission reads them
                demand = elastic_demand(demand, resolution.spec, storage)
            except InvalidSpec as err:
                errors += (err.details or {}).get("issues", [])
        out.update(
            valid=not errors,
            spec=resolution.spec,
            argv=normalized.spec.to_argv(),
            derived=_jsonable(normalized.derived),
            warnings=[w.to_dict() for w in [*normalized.warnings, *resolution.warnings]],
            errors=errors,
            demand=demand,
            capacity=capacity,
        )
        return out

    def _refuse_what_cannot_run(
        self, normalized: jobspec.NormalizedSpec, pool: Pool | PoolRef, *, backend_judged: bool = False
    ) -> None:
        """InvalidSpec for parameters this platform does not run (`spec.unsupported_by_backend`; not looked for
        again with `backend_judged`: this very spec passed them in `judge`) and for a job no node layout of its
        pool can ever hold (`job.unschedulable`), which would otherwise wait QUEUED forever."""
        demand = normalized.demand.model_dump(mode="json")
        refused = [] if backend_judged else backend_refusals(normalized.spec_dict(), normalized.changed)
        if self._fits(pool.name, demand) is False:  # the whole capacity picture only for the message
            refused += _unschedulable(self._capacity(pool, demand), demand)
        if refused:
            code = "job.unschedulable" if all(i["code"] == "job.unschedulable" for i in refused) else None
            issues = refused + [w.to_dict() for w in normalized.warnings]
            raise InvalidSpec(_summary(refused), code=code, details={"issues": issues})

    @staticmethod
    def _normalize_spec(
        sub: Submission, max_node: int | None
    ) -> tuple[jobspec.NormalizedSpec, dict[str, Any]]:
        """Normalize the submitted spec or flags for a pool whose largest node has `max_node` GPUs;
        InvalidSpec lists its issues, one per mistake. No database: this is the part that takes time."""
        if (sub.spec is None) == (sub.args is None):
            message = "give exactly one of 'spec' (an object) or 'args' (Relax CLI flags)"
            raise InvalidSpec(
                message, details={"issues": [SpecIssue("job.spec_or_args", "spec", message).to_dict()]}
            )
        try:
            if sub.spec is not None:
                normalized = jobspec.normalize(obj=sub.spec, max_gpus_per_node=max_node)
                submitted: dict[str, Any] = {"spec": sub.spec}
            else:
                argv = _split_args(sub.args)
                normalized = jobspec.normalize(argv=argv, max_gpus_per_node=max_node)
                submitted = {"args": argv}
                if sub.launch_script is not None:
                    submitted["launch_script"] = dict(sub.launch_script)
        except jobspec.SpecError as err:
            issues = [i.to_dict() for i in err.issues]
            invalid = InvalidSpec(_summary(issues), details={"issues": issues})
            invalid.understood = err.understood  # for the dry run; not part of the error body
            raise invalid from None
        return normalized, submitted

    def _read_platform(
        self, team: Team, queue_name: str | None = None, idempotency_key: str | None = None
    ) -> PlatformRead:
        """The queue named, the priority classes, the nodes, the team's grants and endpoints, and the job with
        the idempotency key, in one statement; once per unit of work."""
        if self._platform is None or self._platform.team_id != team.id:
            queue: QueueRow | None = None
            classes: dict[str, ClassRow] = {}
            nodes: dict[str, list[tuple[str, int]]] = {}
            grants: list[tuple[str | None, str, str]] = []
            endpoints: webhooks.Endpoints = []
            idempotent: str | None = None
            params = {"team_id": team.id, "queue": queue_name, "key": idempotency_key}
            for kind, a, b, c, n, p in self.session.execute(_PLATFORM, params):
                if kind == "q":
                    queue = QueueRow(a, b, c)
                elif kind == "i":
                    idempotent = a
                elif kind == "c":
                    classes[a] = ClassRow(a, int(n), bool(p))
                elif kind == "n":
                    nodes.setdefault(a, []).append((b, int(n)))
                elif kind == "w":
                    endpoints.append((a, b, json_loads(c) if c is not None else None))
                else:
                    grants.append((c, a, b))
            grants.sort(key=lambda g: g[1])
            self._platform = PlatformRead(
                team.id, queue_name, queue, classes, nodes, grants, endpoints, idempotency_key, idempotent
            )
            self._node_cache = nodes
        return self._platform

    def _nodes(self) -> dict[str, list[tuple[str, int]]]:
        """Every node's name and GPUs, by pool (cordoned and down nodes too: they may come back); read once
        per unit of work (with the priority classes and the grants: `_read_platform`)."""
        if self._node_cache is None:
            nodes: dict[str, list[tuple[str, int]]] = {}
            for pool_name, node, gpus in self.session.execute(_NODES):
                nodes.setdefault(pool_name, []).append((node, int(gpus)))
            self._node_cache = nodes
        return self._node_cache

    def _max_node(self, pool: Pool | PoolRef) -> int | None:
        return max((g for _, g in self._nodes().get(pool.name, [])), default=None)

    def _fits(self, pool_name: str, demand: dict[str, Any]) -> bool | None:
        """Whether the demand could ever be placed in the pool taken empty; None for a pool with no nodes."""
        members = self._nodes().get(pool_name, [])
        if not members:
            return None
        cap = PoolCapacity(pool_name, [PolicyNode(name=n, pool=pool_name, gpus=g) for n, g in members])
        cap.index()
        return place_demand(cap, gangs_of(demand), frozenset()) is not None

    def _capacity(self, pool: Pool | PoolRef, demand: dict[str, Any]) -> dict[str, Any]:
        """Whether a job's demand could ever be placed: in its own pool and in the largest pool, each
        taken empty with every node it has (cordoned and down nodes too: they may come back)."""
        nodes = self._nodes()
        fits_in = {name: self._fits(name, demand) for name in {*nodes, pool.name}}  # one placement try a pool

        def describe(name: str) -> dict[str, Any]:
            members = nodes.get(name, [])
            fits = fits_in[name]
            return {
                "name": name,
                "gpus": sum(g for _, g in members),
                "nodes": len(members),
                "largest_node": max((g for _, g in members), default=0),
                "fits": fits,
            }

        own = describe(pool.name)
        largest = (
            describe(max(nodes, key=lambda p: (sum(g for _, g in nodes[p]), max(g for _, g in nodes[p]))))
            if nodes
            else own
        )
        return {
            "needs_gpus": int(demand.get("total_gpus", 0)),
            "pool": own,
            "largest_pool": largest,
            "fits_some_pool": any(fits_in[name] for name in nodes),
        }

    def _priority_class(
        self, principal: Principal, team: Team, name: str | None, *, eval_job: bool = False
    ) -> ClassRow:
        """The class to submit at: one the team was granted (platform.granted_priority_classes), or
        403 naming it. Without a name: `normal`, or the team's highest granted class when `normal` is
        not granted. Admins are not bound by a team's grant (they set it; the audit log shows it). The eval
        class is an eval job's without a grant, and no other job's, an admin's neither (422)."""
        classes = self._read_platform(team).classes  # one read for all, with the nodes and the grants
        if name == EVAL_PRIORITY_CLASS and name in classes:
            if eval_job:
                return classes[name]
            message = f"the priority class {name!r} is for eval jobs only"
            raise InvalidRequest.naming(
                "priority_class",
                message,
                "run an eval with POST /v1/evals (`relaxctl eval`), which submits its job at this class; give a "
                "job a class the team is granted (GET /v1/teams/<team>)",
                code="priority_class.eval_only",
            )
        allowed = [] if principal.is_admin else granted_among(list(classes.values()), team)
        if name is None and not principal.is_admin and "normal" not in allowed and allowed:
            name = allowed[0]
        pclass = classes.get(name or "normal")
        if pclass is None:
            known = sorted(classes)
            raise InvalidRequest.naming(
                "priority_class",
                f"unknown priority class {name!r}",
                f"one of {', '.join(known)}",
                code="priority_class.not_found",
            )
        if principal.is_admin or pclass.name in allowed:
            return pclass
        why = (
            " (its jobs are never preempted: only an admin's grant allows it)"
            if not pclass.preemptible
            else ""
        )
        message = f"team {team.name!r} may not submit at priority class {pclass.name!r}{why}"
        hint = (
            f"use {', '.join(allowed)}" if allowed else "the team may use no priority class"
        ) + f"; an admin grants classes with `relaxctl admin teams set {team.name} --priority-classes …`"
        raise PermissionDenied.naming("priority_class", message, hint, code="priority_class.not_granted")

    def _queue_for(self, principal: Principal, team: Team, queue_name: str | None) -> QueueRow:
        """The queue to submit to: the team's own, or one an admin granted it; without a name, the
        team's first. For a team key, a queue that does not exist and a queue it may not use get the
        same 403, so queue names of other teams cannot be probed."""
        if queue_name:
            queue = self._queue(team, queue_name)
            if queue is not None and (queue.team_id == team.id or queue.name in (team.allowed_queues or [])):
                return queue
            if queue is None and principal.is_admin:
                raise NotFound(f"queue {queue_name!r} not found", code="queue.not_found")
            allowed = granted_queues(self.session, team)
            message = f"team {team.name!r} may not submit to queue {queue_name!r}"
            hint = (
                f"use {', '.join(allowed)} (or name no queue)" if allowed else "the team has no queue"
            ) + f"; an admin grants queues with `relaxctl admin teams set {team.name} --queues …`"
            raise PermissionDenied.naming("queue", message, hint, code="queue.not_granted")
        allowed = granted_queues(self.session, team)
        if not allowed:
            raise NotFound(f"team {team.name!r} has no queue", code="queue.not_found")
        queue = self._queue(team, allowed[0])
        assert queue is not None
        return queue

    def _queue(self, team: Team, name: str) -> QueueRow | None:
        """A queue by name: read with the platform's small tables (`_read_platform`), unless they were read
        already for another."""
        read = self._read_platform(team, name)
        if read.queue_name == name:
            return read.queue
        row = self.session.execute(_QUEUE, {"name": name}).first()
        return QueueRow(*row) if row is not None else None

    def _storage(self, team: Team, pool: Pool | PoolRef | None) -> TeamStorage:
        """What the team's jobs in `pool` may reach (scheduler/services/paths.py)."""
        if self.home is None:
            raise RuntimeError("JobSubmission needs the platform's home to resolve job paths")
        pool_name = pool.name if pool is not None else None
        read = self._platform
        return team_storage(
            self.session,
            home=self.home,
            artifact_root=self.artifact_root,
            team_id=team.id,
            team_name=team.name,
            pool=pool_name,
            grant_rows=read.grant_rows(pool_name) if read is not None and read.team_id == team.id else None,
        )


def judge_and_submit(
    session: Session,
    reads: Session,
    principal: Principal,
    sub: Submission,
    *,
    artifact_root: Path,
    home: Path | None,
) -> Job:
    """A job submitted on behalf of another API (evals, fine-tuning): judged in the read-only unit of work `reads`
    (on SQLite no write lock while the spec is normalized), stored in `session`. Raises what `submit` raises."""
    reader = JobSubmission(reads, artifact_root=artifact_root, home=home)
    judged = reader.judge(principal, sub)
    job, _ = JobSubmission(session, artifact_root=artifact_root, home=home).submit(principal, sub, judged)
    return job


def backend_refusals(values: dict[str, Any], changed: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Issues for parameters the job's training backend does not implement (the runtime declares
    what each backend honours): refused at submission, before any GPU is spent, never ignored.

    An unavailable backend is the one mistake: its issue comes alone, not with every parameter that
    backend would have read."""
    defaults = _field_defaults()
    backend = values.get("train_backend")
    issues = []
    problems = unsupported_parameters(values, defaults, changed)  # changed: NormalizedSpec.changed
    if any(p.startswith("train_backend=") for p in problems):
        problems = [p for p in problems if p.startswith("train_backend=")]
    for item in problems:
        name, _, value = item.partition("=")
        flag = name.replace("_", "-")
        if name == "train_backend":
            message = (
                f"--train-backend {value.strip(chr(39))} is not available on this platform: it runs the "
                "torch and megatron backends"
            )
            hint = (
                "use --train-backend megatron or torch (docs/reference/capabilities.md lists the parameters "
                "each implements)"
            )
        elif value:
            message = f"--{flag} {value} is not implemented by the {backend} backend"
            hint = RESTRICTION_HINTS.get(
                name, f"use a value the {backend} backend implements (docs/reference/capabilities.md)"
            )
            if name in RESTRICTION_HINTS:
                message += " with these settings"
        else:
            message = f"--{flag} is set, but the {backend} backend does not implement it"
            hint = (
                f"remove --{flag}; see docs/reference/capabilities.md for what the {backend} backend honours"
            )
        issues.append(SpecIssue("spec.unsupported_by_backend", flag, message, hint).to_dict())
    return issues


@cache
def _field_defaults() -> dict[str, Any]:
    return {name: getattr(f, "default", None) for name, f in jobspec.FIELDS.items()}


def _unschedulable(capacity: dict[str, Any], demand: dict[str, Any]) -> list[dict[str, Any]]:
    """`job.unschedulable` when no node layout of the job's pool can ever hold its demand (a pool with no
    nodes registered yet is not judged)."""
    own, largest = capacity["pool"], capacity["largest_pool"]
    if own["fits"] is not False:
        return []
    message = (
        f"pool {own['name']!r} can never hold this job: it needs {capacity['needs_gpus']} GPU(s) "
        f"({demand.get('summary', '')}), and the pool has {own['gpus']} GPU(s) on {own['nodes']} node(s) of "
        f"at most {own['largest_node']}"
    )
    if largest["name"] != own["name"]:
        message += (
            f"; the largest pool, {largest['name']!r}, has {largest['gpus']} GPU(s) on nodes of at most "
            f"{largest['largest_node']}"
            + (" and could hold it" if largest["fits"] else ", not enough either")
        )
    else:
        message += " (the largest pool)"
    if demand.get("legacy_layout"):
        hint = (
            "set --resource to size the job, e.g. --resource "
            f'\'{{"actor": [1, {max(own["largest_node"], 1)}], "rollout": [1, {max(own["largest_node"], 1)}]}}\' '
            "with --colocate"
        )
    else:
        hint = "make --resource (and the parallel sizes) fit the pool's nodes"
    if largest["name"] != own["name"] and largest["fits"]:
        hint += f", or submit to a queue on pool {largest['name']!r}"
    return [
        SpecIssue(
            "job.unschedulable", "resource", message, hint, fields=["resource", "num-gpus-per-node"]
        ).to_dict()
    ]


def _is_error(issue: dict[str, Any]) -> bool:
    return issue.get("severity", "error") == "error"


def _split_args(args: Sequence[str] | str | None) -> list[str]:
    """Relax flags as a list; one string is split as a shell would (a quote left open is an error)."""
    if not isinstance(args, str):
        return list(args or [])
    try:
        return shlex.split(args)
    except ValueError as exc:
        issue = SpecIssue(
            "argv.unparsable",
            None,
            f"the flags cannot be split as a shell would: {exc}",
            "close the quote, or send 'args' as a list of strings",
        )
        raise InvalidSpec(
            f"invalid job spec: {issue.message}", details={"issues": [issue.to_dict()]}
        ) from None


def _summary(issues: list[dict[str, Any]]) -> str:
    errors = [i for i in issues if i.get("severity", "error") == "error"] or issues
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    where = f"{first['field']}: " if first.get("field") else ""
    return f"invalid job spec: {where}{first['message']}{more}"


def _default_name(spec: dict[str, Any]) -> str:
    if spec.get("loss_type") in ("sft", "sft_loss"):
        return "sft"
    return str(spec.get("advantage_estimator") or "job")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
