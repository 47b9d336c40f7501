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


class PoolsPage(BaseModel):
    data: list[dict[str, Any]]


class QueuesPage(BaseModel):
    data: list[dict[str, Any]]
