"""Job request and response schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

JobStatusName = Literal[
    "QUEUED",
    "ADMITTED",
    "STARTING",
    "RUNNING",
    "CANCELLING",
    "PREEMPTING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
]
FailureReasonName = Literal["setup", "user_code", "no_resource", "controller", "lost"]


class JobCreate(BaseModel):
    """Submit a job: the Relax config as an object (`spec`) or as Relax CLI flags (`args`)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        None,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Job name; other jobs refer to its outputs as job://<name>/<path>.",
    )
    team: str | None = Field(None, description="Team name or id (default: the key's team).")
    queue: str | None = Field(None, description="Queue name (default: the team's first queue).")
    priority_class: str | None = Field(
        None,
        validation_alias=AliasChoices("priority_class", "priority-class"),
        description="Priority class (default `normal`): orders jobs within a queue; some are not preemptible.",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    spec: dict[str, Any] | None = Field(
        None,
        description="Relax parameters, keys as in the reference ('rollout-batch-size' or 'rollout_batch_size').",
    )
    args: list[str] | str | None = Field(
        None,
        description="Relax CLI flags, as a list or one shell-quoted string: ['--rollout-batch-size', '8', ...].",
    )


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    team_id: str
    queue: str
    pool: str
    status: JobStatusName
    status_reason: str | None = Field(description="Why the job is in its status (for FAILED: the error).")
    failure_reason: FailureReasonName | None
    priority_class: str
    priority: int
    preemptible: bool
    queue_position: int | None
    wait_reason: str | None
    labels: dict[str, str]
    total_gpus: int
    attempt: int
    preemptions: int
    progress_step: int | None
    total_steps: int | None
    output_dir: str
    ray_submission_id: str | None
    created_at: datetime
    updated_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_report_at: datetime | None


class JobDetail(JobPublic):
    spec: dict[str, Any]
    submitted: dict[str, Any]
    demand: dict[str, Any]
    allocations: list[dict[str, Any]] = Field(default_factory=list)


class JobsPage(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class JobEventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    time: datetime
    kind: str
    from_status: str | None
    to_status: str | None
    reason: str | None


class JobEventsPage(BaseModel):
    data: list[JobEventPublic]


class MetricPoint(BaseModel):
    step: int
    value: float
    time: datetime


class JobMetrics(BaseModel):
    job_id: str
    series: dict[str, list[MetricPoint]]


class LogLinePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    time: datetime
    level: str
    source: str
    message: str


class LogsPage(BaseModel):
    data: list[LogLinePublic]
    next_after: int = Field(description="Pass as `after` to get the lines that follow.")


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    step: int
    path: str
    size_bytes: int
    format: str
    time: datetime


class CheckpointsPage(BaseModel):
    data: list[CheckpointPublic]


class RolloutPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    rollout_id: int
    split: str
    path: str
    num_samples: int
    time: datetime


class RolloutsPage(BaseModel):
    data: list[RolloutPublic]


class PredictionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    step: int
    path: str
    num_samples: int
    time: datetime


class PredictionsPage(BaseModel):
    data: list[PredictionPublic]


class SpecValidate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] | None = None
    args: list[str] | str | None = None
    queue: str | None = None
    team: str | None = None


class SpecValidation(BaseModel):
    valid: bool
    spec: dict[str, Any] | None = None
    argv: list[str] | None = None
    derived: dict[str, Any] = Field(default_factory=dict)
    warnings: list[dict[str, Any]] = Field(default_factory=list)
    errors: list[dict[str, Any]] = Field(default_factory=list)
    demand: dict[str, Any] | None = None
    queue: str | None = None
    pool: str | None = None


class ReportCreate(BaseModel):
    """One batch from a job's driver."""

    attempt: int
    seq: int
    phase: str | None = None
    progress: dict[str, int] | None = None
    metrics: list[dict[str, Any]] = Field(default_factory=list)
    logs: list[dict[str, Any]] = Field(default_factory=list)
    checkpoints: list[dict[str, Any]] = Field(default_factory=list)
    rollouts: list[dict[str, Any]] = Field(default_factory=list)
    predictions: list[dict[str, Any]] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)


class ReportAck(BaseModel):
    stop_requested: bool
