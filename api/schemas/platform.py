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


class NodePublic(BaseModel):
    name: str
    gpus: int
    allocated_gpus: int
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
    used_gpus: int
    queued_jobs: int


class QueuesPage(BaseModel):
    data: list[QueuePublic]
