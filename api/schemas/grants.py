"""Path grants and what a team's jobs may reach (`/v1/admin/path-grants`, `/v1/storage`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import RequestBody


class PathGrantCreate(RequestBody):
    team: str = Field(description="The team's name or id.")
    path: str = Field(
        max_length=4096,
        description="An absolute path outside the platform's home and artifact store (not '/').",
    )
    mode: Literal["ro", "rw"] = Field(description="ro: jobs read it; rw: jobs read and write it.")
    pool: str | None = Field(None, description="The pool whose jobs it applies to; null: every pool.")


class PathGrantPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    team_id: str
    pool: str | None = Field(description="null: every pool.")
    path: str = Field(description="Absolute and normalized (symbolic links resolved).")
    mode: str = Field(description="ro | rw")
    created_at: datetime
    created_by: str | None = Field(description="Id of the key that created it.")


class PathGrantsPage(BaseModel):
    data: list[PathGrantPublic]


class StoragePublic(BaseModel):
    """Where the team's jobs read and write: its area (`artifacts://`), its jobs' folders, its grants."""

    team: str
    team_name: str
    area: str = Field(description="The folder `artifacts://` names for this team.")
    jobs: str = Field(description="Where the team's jobs write their outputs (`<area>/jobs/<job id>`).")
    grants: list[PathGrantPublic]
