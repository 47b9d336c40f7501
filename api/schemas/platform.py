"""Schemas of pools, queues, teams, API keys and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas import Labels, RequestBody
from jobspec.bounds import MAX_DEMAND_GPUS, MAX_GPUS_PER_NODE
from scheduler.db.models import Pool
from scheduler.domain.jobs import JobStatus

#: GPUs (slots) of one node: the scheduling pass sizes its tables by a node's count, so it is bounded as a
#: spec's per-node GPU count is (a node of 2^63-1 GPUs made a pass allocate until its worker had 16.6 GB).
NodeGpus = Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)]
#: A queue's quota in GPUs: at most what one job may ask for, beyond any cluster.
GpuQuota = Annotated[int, Field(ge=0, le=MAX_DEMAND_GPUS)]
#: Fair-share weight: only ratios between queues matter; the bound keeps shares finite.
MAX_QUEUE_WEIGHT = 1e6
QueueWeight = Annotated[float, Field(gt=0, le=MAX_QUEUE_WEIGHT, allow_inf_nan=False)]


def _column_length(column: Any) -> int:
    """The length of a String column: the schema states what the table holds (PostgreSQL refuses more)."""
    return int(column.property.columns[0].type.length)


Accelerator = Annotated[str, Field(max_length=_column_length(Pool.accelerator))]
RayAddress = Annotated[str, Field(max_length=_column_length(Pool.ray_address))]
PythonPath = Annotated[str, Field(max_length=_column_length(Pool.python))]


class TeamCreate(RequestBody):
    name: str = Field(max_length=100, pattern=r"^[a-z0-9][a-z0-9-]*$")


class TeamPublic(BaseModel):
    id: str
    name: str
    created_at: datetime
    allowed_priority_classes: list[str] | None = Field(
        description="Priority classes an admin granted the team; null: every preemptible class."
    )
    allowed_queues: list[str] | None = Field(
        description="Queues of other teams an admin granted the team (its own are always allowed)."
    )
    priority_classes: list[str] = Field(description="The classes the team may submit at now.")
    queues: list[str] = Field(description="The queues the team may submit to now (its own first).")


class TeamUpdate(RequestBody):
    """An admin sets what a team may use. A field left out is unchanged; null resets it to the default."""

    allowed_priority_classes: list[str] | None = Field(
        None,
        description="Classes the team may submit at; null: every preemptible class (a class that is never "
        "preempted, like `high`, only by naming it here).",
        examples=[["low", "normal"]],
    )
    allowed_queues: list[str] | None = Field(
        None, description="Queues of other teams the team may submit to besides its own.", examples=[[]]
    )


class TeamsPage(BaseModel):
    data: list[TeamPublic]


class ApiKeyCreate(RequestBody):
    name: str = Field(max_length=100)
    role: str = Field(
        "member",
        pattern="^(admin|team_admin|member|viewer)$",
        description="admin (every team; admins only), team_admin, member or viewer.",
    )
    team: str | None = Field(
        None,
        description="Team name or id; required for the team roles when an admin creates the key (a team "
        "admin's keys are for their own team).",
    )
    expires_in_days: int | None = Field(None, ge=1, le=3650, description="The key stops working after this.")
    expires_at: datetime | None = Field(None, description="Or the time it stops working (with a timezone).")

    @model_validator(mode="after")
    def _one_expiry(self) -> ApiKeyCreate:
        if self.expires_in_days is not None and self.expires_at is not None:
            raise ValueError("give expires_in_days or expires_at, not both")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise ValueError("expires_at needs a timezone, e.g. 2027-01-31T00:00:00Z")
        return self


class ApiKeyPublic(BaseModel):
    """A key without its secret: `prefix` is its first characters, enough to recognise it."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    role: str
    team_id: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = Field(description="null: until revoked.")
    created_by: str | None = Field(description="Id of the key that created it.")


class ApiKeyCreated(ApiKeyPublic):
    key: str = Field(description="The secret; shown once.")


class ApiKeysPage(BaseModel):
    data: list[ApiKeyPublic]


class NodeJob(BaseModel):
    job_id: str
    gpus: int = Field(description="GPUs the job holds on this node (colocated roles share them).")


class NodePublic(BaseModel):
    name: str
    gpus: int
    allocated_gpus: int
    jobs: list[NodeJob] = Field(description="Jobs holding GPUs on this node (for a team key: the team's).")
    other_gpus: int = Field(
        0, description="GPUs held here by jobs not listed in `jobs`: other teams' jobs, for a team key."
    )
    labels: dict[str, str]
    cordoned: bool
    alive: bool


class PoolPublic(BaseModel):
    name: str
    accelerator: str
    ray_address: str | None = Field(description="The cluster's Ray Jobs API address; null unless admin.")
    cordoned: bool
    total_gpus: int
    allocated_gpus: int
    jobs_holding_slots: int
    jobs_queued: int
    nodes: list[NodePublic]


class PoolsPage(BaseModel):
    data: list[PoolPublic]


class QueuePublic(BaseModel):
    name: str
    pool: str
    team: str
    nominal_gpus: int
    borrowing_limit: int | None
    lending_limit: int | None
    weight: float
    used_gpus: int = Field(description="GPUs held by the queue's admitted and running jobs.")
    borrowed_gpus: int = Field(description="GPUs used above the nominal quota (lent by idle queues).")
    running_jobs: int
    queued_jobs: int
    queued_gpus: int = Field(description="GPUs the queue's waiting jobs ask for in all.")


class QueuesPage(BaseModel):
    data: list[QueuePublic]


class NodeCreate(RequestBody):
    name: str = Field(max_length=100)
    gpus: NodeGpus = Field(description="GPUs of the node (slots on a CPU pool).")
    labels: Labels = Field(default_factory=dict)


class NodeUpdate(RequestBody):
    gpus: NodeGpus | None = None
    labels: Labels | None = None
    cordoned: bool | None = Field(None, description="No new jobs are placed on a cordoned node.")
    alive: bool | None = Field(None, description="false marks the node down: its jobs are requeued.")


class PoolCreate(RequestBody):
    name: str = Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    accelerator: Accelerator = Field(description="e.g. h200, a100, cpu")
    ray_address: RayAddress | None = Field(
        None, description="Ray Jobs API address, e.g. http://ray-head:8265"
    )
    python: PythonPath | None = Field(
        None, description="Interpreter of the drivers on the cluster (default: python)."
    )
    nodes: list[NodeCreate] = Field(default_factory=list, max_length=10_000)


class PoolUpdate(RequestBody):
    accelerator: Accelerator | None = None
    ray_address: RayAddress | None = None
    python: PythonPath | None = None
    cordoned: bool | None = None


class QueueCreate(RequestBody):
    name: str = Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    pool: str
    team: str = Field(description="Team name or id that owns the queue.")
    nominal_gpus: GpuQuota = Field(description="Guaranteed GPUs of the queue in its pool.")
    borrowing_limit: GpuQuota | None = Field(
        None, description="Most GPUs above nominal it may borrow (none: no limit)."
    )
    lending_limit: GpuQuota | None = Field(
        None, description="Most of its idle nominal GPUs others may borrow (none: all)."
    )
    weight: QueueWeight = Field(1.0, description="Fair-share weight.")


class QueueUpdate(RequestBody):
    nominal_gpus: GpuQuota | None = None
    borrowing_limit: GpuQuota | None = None
    lending_limit: GpuQuota | None = None
    weight: QueueWeight | None = None


class PriorityClassCreate(RequestBody):
    name: str = Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    value: int = Field(ge=-100000, le=100000, description="Higher runs first within a queue.")
    preemptible: bool = True
    description: str | None = None


class PriorityClassPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    name: str
    value: int
    preemptible: bool
    description: str | None


class PriorityClassesPage(BaseModel):
    data: list[PriorityClassPublic]


class AuditEventPublic(BaseModel):
    """One mutating API call: who made it, which route, on what, and its status code."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    time: datetime
    request_id: str | None
    key_id: str | None = Field(description="null: no key, or one that was not found.")
    role: str | None
    team_id: str | None = Field(description="The calling key's team (null for admin keys).")
    method: str
    path: str = Field(description="The route template, e.g. /v1/jobs/{job_id}/cancel.")
    target: str | None = Field(description="The object the call named or created, e.g. a job id.")
    status_code: int
    details: dict[str, Any] = Field(description="Safe details (job name, queue, role…); never secrets.")


class AuditEventsPage(BaseModel):
    data: list[AuditEventPublic]
    next_cursor: int | None = Field(description="Pass as `after` for the next (older) page.")


class DrainResult(BaseModel):
    pool: str
    node: str
    requeued: dict[str, JobStatus] = Field(description="job id -> its new status (PREEMPTING or QUEUED)")
