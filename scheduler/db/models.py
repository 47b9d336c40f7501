"""Database tables (SQLAlchemy 2 typed mappings). Rows only: no business rules here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column

from runtime import report_protocol
from scheduler.db.spec_column import SpecJSON
from scheduler.domain.jobs import JobStatus


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JsonType = sa.JSON().with_variant(JSONB(), "postgresql")

#: What an integer column holds: `Mapped[int]` is PostgreSQL's INTEGER, the row ids are BIGINT (SQLite's
#: INTEGER is 64-bit). A request's number beyond its column's range is refused before it is bound (the
#: driver raises OverflowError or NumericValueOutOfRange, which would answer 500). Declared with the report
#: protocol, whose items these columns store (the runtime may not import the scheduler); re-exported here.
INTEGER_MIN, INTEGER_MAX, BIGINT_MAX = (
    report_protocol.INTEGER_MIN,
    report_protocol.INTEGER_MAX,
    report_protocol.BIGINT_MAX,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def job_status_type(constraint: str) -> sa.Enum:
    """A column of `JobStatus` values: stored as the member's value in a VARCHAR(20), held to the members by a CHECK
    constraint named `constraint` (not PostgreSQL's native enum: docs/adr/0008), read back as the member. A string
    is bound as it is: a filter on a status that is none (`GET /v1/jobs?status=...`) matches nothing, and writing
    one is refused by the constraint."""
    return sa.Enum(
        JobStatus,
        name=constraint,
        native_enum=False,
        create_constraint=True,
        length=20,
        values_callable=lambda members: [m.value for m in members],
    )


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime, dict[str, Any]: JsonType, list[Any]: JsonType}


class JobRow:
    """The key of a table of a job's rows: a big-integer `id`, and `job_id` (indexed; the rows go with the job)."""

    # sort_order: first in the table, as a table's own columns would be
    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, sort_order=-2
    )
    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True, sort_order=-1
    )


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Priority classes the team may submit at, granted by an admin; None: every preemptible class
    # (a non-preemptible class only by grant).
    allowed_priority_classes: Mapped[list[Any] | None] = mapped_column(JsonType)
    # Queues (of other teams) the team may submit to besides its own, granted by an admin.
    allowed_queues: Mapped[list[Any] | None] = mapped_column(JsonType)


class PathGrant(Base):
    """A filesystem location outside the team's own area that an admin lets a team read (ro) or read and
    write (rw), in one pool or (pool None) every pool."""

    __tablename__ = "path_grants"
    __table_args__ = (sa.UniqueConstraint("team_id", "pool", "path", name="uq_path_grants_team_pool_path"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    pool: Mapped[str | None] = mapped_column(sa.ForeignKey("pools.name", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(sa.Text)  # absolute, normalized, no symlinks
    mode: Mapped[str] = mapped_column(sa.String(2))  # ro | rw
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(sa.String(40))  # API key id


class AuditEvent(Base):
    """One mutating API call: who, what, on what, and how it ended. Readable by admins only."""

    __tablename__ = "audit_events"
    __table_args__ = (sa.Index("ix_audit_events_time", "time"),)

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    request_id: Mapped[str | None] = mapped_column(sa.String(64))
    key_id: Mapped[str | None] = mapped_column(sa.String(40))  # None: the call was not authenticated
    role: Mapped[str | None] = mapped_column(sa.String(20))
    team_id: Mapped[str | None] = mapped_column(sa.String(40))
    method: Mapped[str] = mapped_column(sa.String(10))
    path: Mapped[str] = mapped_column(sa.Text)  # the route template, e.g. /v1/jobs/{job_id}/cancel
    target: Mapped[str | None] = mapped_column(sa.Text)  # the resource id the call named, if any
    status_code: Mapped[int]
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # never secrets


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100))
    team_id: Mapped[str | None] = mapped_column(sa.ForeignKey("teams.id"))
    role: Mapped[str] = mapped_column(sa.String(20))  # admin | team_admin | member | viewer
    key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    prefix: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]  # None: until revoked
    created_by: Mapped[str | None] = mapped_column(sa.String(40))  # the key that created it


class Pool(Base):
    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(sa.String(63), primary_key=True)
    accelerator: Mapped[str] = mapped_column(sa.String(40))  # e.g. h200, cpu
    ray_address: Mapped[str | None] = mapped_column(sa.String(255))  # Ray Jobs API (dashboard) URL
    python: Mapped[str | None] = mapped_column(sa.String(255))  # interpreter of the driver on the cluster
    cordoned: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Node(Base):
    __tablename__ = "nodes"

    pool: Mapped[str] = mapped_column(sa.ForeignKey("pools.name"), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    gpus: Mapped[int]
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cordoned: Mapped[bool] = mapped_column(default=False)
    alive: Mapped[bool] = mapped_column(default=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # The Ray node this is (Ray's hex node id, its `ray.io/node-id` label): the driver pins the bundles of the
    # GPUs allocated here to it. None for a node registered by hostname only (its bundles go where Ray puts them).
    ray_node_id: Mapped[str | None] = mapped_column(sa.String(64), default=None)


class Queue(Base):
    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(sa.String(63), primary_key=True)
    pool: Mapped[str] = mapped_column(sa.ForeignKey("pools.name"))
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id"))
    nominal_gpus: Mapped[int]
    borrowing_limit: Mapped[int | None]
    lending_limit: Mapped[int | None]
    weight: Mapped[float] = mapped_column(default=1.0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PriorityClass(Base):
    """A named priority (Kueue's WorkloadPriorityClass): its value orders jobs within a queue, and
    `preemptible` says whether the scheduler may preempt jobs of this class."""

    __tablename__ = "priority_classes"

    name: Mapped[str] = mapped_column(sa.String(63), primary_key=True)
    value: Mapped[int]
    preemptible: Mapped[bool] = mapped_column(default=True)
    description: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobWait(Base):
    """Why a queued job waits, as the last scheduling pass left it. A table of its own because a pass rewrites
    it for most queued jobs (an admission moves every job behind it up one place): narrow rows that
    PostgreSQL updates in place (heap-only tuples, room kept by the fill factor), where updating the wide job
    rows (their indexes, their JSON) cost a pass over 2,000 queued jobs ~100 ms of CPU (docs/reliability.md).
    The job's attributes of the same names read it (`Job.wait_reason`, ...)."""

    __tablename__ = "job_waits"
    __table_args__ = {"postgresql_with": {"fillfactor": 70}}

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    queue_position: Mapped[int | None]  # 1-based, among the pool's queued jobs
    wait_reason: Mapped[str | None] = mapped_column(sa.Text)  # why the pass did not admit it
    # Nodes ("pool/node") that preemptions are freeing for this queued job: no other job starts there
    # first. Written by each pass (policy Decision.nominate), cleared when the job is admitted.
    nominated_nodes: Mapped[list[Any] | None] = mapped_column(JsonType)


def _wait_of(job_id: Any, column: str) -> sa.ScalarSelect[Any]:
    """A job's `JobWait` value, as a correlated subquery (NULL without a row)."""
    return (
        sa.select(getattr(JobWait.__table__.c, column))
        .where(JobWait.__table__.c.job_id == job_id)
        .scalar_subquery()
    )


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency_key"),
        sa.Index("ix_jobs_status_pool", "status", "pool"),
        sa.Index("ix_jobs_team_name", "team_id", "name"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100))
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id"))
    queue: Mapped[str] = mapped_column(sa.ForeignKey("queues.name"))
    pool: Mapped[str] = mapped_column(sa.ForeignKey("pools.name"))
    status: Mapped[JobStatus] = mapped_column(job_status_type("ck_jobs_status"))
    status_reason: Mapped[str | None] = mapped_column(sa.Text)
    status_changed_at: Mapped[datetime] = mapped_column(default=utcnow)
    failure_reason: Mapped[str | None] = mapped_column(sa.String(20))
    priority_class: Mapped[str] = mapped_column(sa.ForeignKey("priority_classes.name"))
    priority: Mapped[int] = mapped_column(default=0)  # the class's value at submission
    preemptible: Mapped[bool] = mapped_column(default=True)
    # Read-only here: the last pass's `JobWait` of a queued job (its own table: each pass rewrites most of them).
    queue_position: Mapped[int | None] = column_property(_wait_of(id, "queue_position"))
    wait_reason: Mapped[str | None] = column_property(_wait_of(id, "wait_reason"))
    nominated_nodes: Mapped[list[Any] | None] = column_property(_wait_of(id, "nominated_nodes"))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # normalized Relax spec, paths resolved; stored as what differs from the defaults (scheduler/db/spec_column.py)
    spec: Mapped[dict[str, Any]] = mapped_column(SpecJSON)
    submitted: Mapped[dict[str, Any]]  # what the user sent: {"spec": {...}} or {"args": [...]}
    demand: Mapped[dict[str, Any]]
    total_gpus: Mapped[int]
    output_dir: Mapped[str] = mapped_column(sa.Text)
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(200))
    attempt: Mapped[int] = mapped_column(default=0)  # increases on each (re)launch
    preemptions: Mapped[int] = mapped_column(default=0)
    # GPU-seconds of its earlier runs (the current run counts from launched_at): attained service.
    service_gpu_s: Mapped[float] = mapped_column(sa.Float(precision=53), default=0.0)
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)  # when it last entered QUEUED
    ray_submission_id: Mapped[str | None] = mapped_column(sa.String(100))
    report_seq: Mapped[int] = mapped_column(default=-1)  # last report seq applied for `attempt`
    # The attempt whose driver has exchanged its one-time bootstrap secret for the attempt's token
    # (a second exchange for the same attempt is refused).
    token_claimed_attempt: Mapped[int | None]
    progress_step: Mapped[int | None]
    total_steps: Mapped[int | None]
    # An elastic job's (`--autoscaler-config`) rollout engines as its driver last asked for them in this run
    # (`RolloutWish`, scheduler/services/elastic.py) and why; NULL before it has asked. The scheduling pass grows
    # the rollout up to it and gives engines above it back.
    rollout_wish: Mapped[int | None]
    rollout_wish_reason: Mapped[str | None] = mapped_column(sa.String(200))
    # The number of an elastic job's rollout allocation (NULL: 0), one more at each resize: the driver reports the
    # one its engines match, which frees the GPUs of the engines taken back before (`Allocation.released_in`).
    rollout_grant: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    admitted_at: Mapped[datetime | None]
    launched_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    last_report_at: Mapped[datetime | None]


class SpecDefaults(Base):
    """Each set of parameter defaults a stored job spec was written against (scheduler/db/spec_column.py): the id
    is a hash of the JSON, which `spec_values` holds."""

    __tablename__ = "spec_defaults"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    spec_values: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(JobRow, Base):
    __tablename__ = "job_events"

    time: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(sa.String(40))  # "transition" or a driver event kind
    from_status: Mapped[JobStatus | None] = mapped_column(job_status_type("ck_job_events_from_status"))
    to_status: Mapped[JobStatus | None] = mapped_column(job_status_type("ck_job_events_to_status"))
    reason: Mapped[str | None] = mapped_column(sa.Text)


class Allocation(JobRow, Base):
    __tablename__ = "allocations"
    __table_args__ = (sa.Index("ix_allocations_pool_node", "pool", "node"),)

    pool: Mapped[str] = mapped_column(sa.String(63))
    node: Mapped[str] = mapped_column(sa.String(100))
    role: Mapped[str] = mapped_column(sa.String(40))
    replica: Mapped[int] = mapped_column(default=0)
    gpus: Mapped[int]
    # A colocated role riding on its host role's GPUs: listed, but not counted against the node.
    shared: Mapped[bool] = mapped_column(default=False)
    # An elastic job's rollout engine the scheduling pass took back (scheduler/services/elastic.py): the job's grant
    # (`Job.rollout_grant`) that replaced it, once its driver has followed which (or a later one) the engine is
    # stopped and the row goes. Until then its GPUs stay held and no job is placed on them; NULL for the rest.
    released_in: Mapped[int | None]


class Metric(JobRow, Base):
    __tablename__ = "metrics"
    __table_args__ = (
        sa.Index("ix_metrics_job_name_step", "job_id", "name", "step"),
        # the live stream reads a job's points by cursor: WHERE job_id = ? AND id > ? ORDER BY id (docs/stream.md)
        sa.Index("ix_metrics_job_id_id", "job_id", "id"),
    )

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), sort_order=-1
    )  # indexed above
    attempt: Mapped[int]
    step: Mapped[int]
    name: Mapped[str] = mapped_column(sa.String(200))
    value: Mapped[float] = mapped_column(sa.Float(precision=53))
    time: Mapped[datetime]


class LogLine(JobRow, Base):
    __tablename__ = "log_lines"

    attempt: Mapped[int]
    time: Mapped[datetime]
    level: Mapped[str] = mapped_column(sa.String(10))
    source: Mapped[str] = mapped_column(sa.String(40))
    message: Mapped[str] = mapped_column(sa.Text)


class Checkpoint(JobRow, Base):
    __tablename__ = "checkpoints"

    attempt: Mapped[int]
    step: Mapped[int]
    path: Mapped[str] = mapped_column(sa.Text)
    size_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    format: Mapped[str] = mapped_column(sa.String(20))
    time: Mapped[datetime]


class Rollout(JobRow, Base):
    __tablename__ = "rollouts"

    attempt: Mapped[int]
    rollout_id: Mapped[int]
    split: Mapped[str] = mapped_column(sa.String(10))
    path: Mapped[str] = mapped_column(sa.Text)
    num_samples: Mapped[int]
    time: Mapped[datetime]


class Prediction(JobRow, Base):
    """A predictions file of an SFT job (`<save>/predict/predictions_step_<id>.jsonl`)."""

    __tablename__ = "predictions"

    attempt: Mapped[int]
    step: Mapped[int]
    path: Mapped[str] = mapped_column(sa.Text)
    num_samples: Mapped[int]
    time: Mapped[datetime]


class SchedulerLock(Base):
    """One row per named lock; a pass updates its row first so passes run one at a time."""

    __tablename__ = "scheduler_locks"

    name: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    holder: Mapped[str | None] = mapped_column(sa.String(100))
    acquired_at: Mapped[datetime | None]


class WebhookEndpoint(Base):
    """A URL of a team that receives its events, signed with the endpoint's secret (Standard Webhooks;
    scheduler/domain/webhooks.py). The secret is kept as it is because signing needs it; the API shows it once."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(sa.Text)
    description: Mapped[str | None] = mapped_column(sa.String(200))
    event_types: Mapped[list[Any] | None] = mapped_column(JsonType)  # None: every type
    secret: Mapped[str] = mapped_column(sa.String(100))  # whsec_<base64>
    disabled: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(sa.String(40))  # API key id


class WebhookDelivery(Base):
    """One message to one URL (an endpoint's, or a job's `--notify-urls`), its attempts and how it ended. The id
    is the message's `webhook-id`, the same on every attempt. `next_attempt_at` is when it is due (pending), and
    while an attempt is in flight, when that attempt counts as lost; `dispatched_at` when a task was last sent
    for it (the sweep sends one again only after a while)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.Index("ix_webhook_deliveries_endpoint_id", "endpoint_id", "id"),
        sa.Index("ix_webhook_deliveries_state_next", "state", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    endpoint_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )  # None: one of a job's --notify-urls
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"))
    job_id: Mapped[str | None] = mapped_column(sa.String(40), index=True)
    url: Mapped[str] = mapped_column(sa.Text)  # where it goes (an endpoint's URL when it was made)
    event_type: Mapped[str] = mapped_column(sa.String(40))
    payload: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(sa.String(10), default="pending")  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at: Mapped[datetime | None]
    dispatched_at: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    last_status_code: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class StoredFile(Base):
    """A file a team uploaded over HTTP (`/v1/files`): its bytes in the platform's file store (the team's area,
    or an S3 bucket) under `key`; a model archive also unpacked into a folder (`unpacked_key`). `stored_bytes`
    is what counts against the team's quota (the file, plus its unpacked folder)."""

    __tablename__ = "files"
    __table_args__ = (sa.Index("ix_files_team_id_id", "team_id", "id"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(sa.String(255))
    purpose: Mapped[str] = mapped_column(sa.String(20))
    content_type: Mapped[str] = mapped_column(sa.String(100))
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    stored_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    store: Mapped[str] = mapped_column(sa.String(10))  # local | s3
    key: Mapped[str] = mapped_column(sa.Text)  # the file's key in its store
    unpacked_key: Mapped[str | None] = mapped_column(sa.Text)  # a model archive's folder (local store)
    archive_entries: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(sa.String(40))  # API key id


class FileUpload(Base):
    """An upload in parts (`/v1/uploads`, OpenAI's Uploads API's shape): parts are kept in the team's area until
    it is completed into a `StoredFile`, cancelled, or expires."""

    __tablename__ = "file_uploads"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(sa.String(255))
    purpose: Mapped[str] = mapped_column(sa.String(20))
    mime_type: Mapped[str] = mapped_column(sa.String(100))
    bytes: Mapped[int] = mapped_column(sa.BigInteger)  # as declared at creation
    status: Mapped[str] = mapped_column(
        sa.String(10), default="pending"
    )  # pending|completed|cancelled|expired
    file_id: Mapped[str | None] = mapped_column(sa.String(40))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(sa.String(40))


class FileUploadPart(Base):
    """One part of an upload; `digest` (sha256 of its bytes) makes a part sent again idempotent."""

    __tablename__ = "file_upload_parts"
    __table_args__ = (sa.UniqueConstraint("upload_id", "digest", name="uq_file_upload_parts_digest"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    upload_id: Mapped[str] = mapped_column(sa.ForeignKey("file_uploads.id", ondelete="CASCADE"), index=True)
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    digest: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Eval(Base):
    """A CI eval (`/v1/evals`): a model (a job's export or checkpoint, or a path the team may read), the eval sets
    it runs on and thresholds on their metrics; it runs as an eval-only job (`job_id`) and ends passed, failed or
    error once that job ends. `model_key` names the model for its history (`job:<id>`, every export and
    checkpoint of that job, or the path as given); `thresholds` and `metric_values` hold the verdict of each
    threshold and the metrics it read."""

    __tablename__ = "evals"
    __table_args__ = (
        sa.Index("ix_evals_team_id_id", "team_id", "id"),
        sa.Index("ix_evals_team_model", "team_id", "model_key", "id"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(sa.ForeignKey("teams.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(sa.String(100))
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    model: Mapped[dict[str, Any]]  # {job, checkpoint_step, path, hf_checkpoint}
    model_key: Mapped[str] = mapped_column(sa.String(300))
    datasets: Mapped[list[Any]]  # [{name, path}] or [{config}]
    thresholds: Mapped[list[Any]]  # [{metric, op, value, actual, verdict}]
    expected_metrics: Mapped[list[Any]]  # the metrics the eval produces (what a threshold may name)
    metric_values: Mapped[dict[str, Any] | None]  # the job's eval/* metrics, once it ended
    # scheduler.domain.evals.EvalOutcome: running until its job ends, then passed, failed or error
    outcome: Mapped[str] = mapped_column(sa.String(10), default="running")
    reason: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    created_by: Mapped[str | None] = mapped_column(sa.String(40))  # API key id
