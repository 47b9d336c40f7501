"""Schemas of pools, queues, teams and API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TeamCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=100, pattern=r"^[a-z0-9][a-z0-9-]*$")


class TeamPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    created_at: datetime


class TeamsPage(BaseModel):
    data: list[TeamPublic]


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=100)
    role: str = Field("member", pattern="^(admin|member)$")
    team: str | None = Field(None, description="Team name or id; required for member keys.")


class ApiKeyPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    role: str
    team_id: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


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
    jobs: list[NodeJob] = Field(description="Jobs holding GPUs on this node.")
    labels: dict[str, Any]
    cordoned: bool
    alive: bool


class PoolPublic(BaseModel):
    name: str
    accelerator: str
    ray_address: str | None
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


class NodeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=100)
    gpus: int = Field(ge=0, description="GPUs of the node (slots on a CPU pool).")
    labels: dict[str, str] = Field(default_factory=dict)


class NodeUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int | None = Field(None, ge=0)
    labels: dict[str, str] | None = None
    cordoned: bool | None = Field(None, description="No new jobs are placed on a cordoned node.")
    alive: bool | None = Field(None, description="false marks the node down: its jobs are requeued.")


class PoolCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    accelerator: str = Field(description="e.g. h200, a100, cpu")
    ray_address: str | None = Field(None, description="Ray Jobs API address, e.g. http://ray-head:8265")
    python: str | None = Field(
        None, description="Interpreter of the drivers on the cluster (default: python)."
    )
    nodes: list[NodeCreate] = Field(default_factory=list)


class PoolUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    accelerator: str | None = None
    ray_address: str | None = None
    python: str | None = None
    cordoned: bool | None = None


class QueueCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    pool: str
    team: str = Field(description="Team name or id that owns the queue.")
    nominal_gpus: int = Field(ge=0, description="Guaranteed GPUs of the queue in its pool.")
    borrowing_limit: int | None = Field(
        None, ge=0, description="Most GPUs above nominal it may borrow (none: no limit)."
    )
    lending_limit: int | None = Field(
        None, ge=0, description="Most of its idle nominal GPUs others may borrow (none: all)."
    )
    weight: float = Field(1.0, gt=0, description="Fair-share weight.")


class QueueUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nominal_gpus: int | None = Field(None, ge=0)
    borrowing_limit: int | None = Field(None, ge=0)
    lending_limit: int | None = Field(None, ge=0)
    weight: float | None = Field(None, gt=0)


class PriorityClassCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
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


class DrainResult(BaseModel):
    pool: str
    node: str
    requeued: dict[str, str] = Field(description="job id -> its new status (PREEMPTING or QUEUED)")
