"""Dashboard sign-in with a one-time login code (`relaxctl dashboard`), so that no API key travels on a
command line or in a URL. Design: scheduler/services/login_codes.py."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import AuditDep, PrincipalDep, SessionDep, SettingsDep
from api.schemas import ERROR_RESPONSES, RequestBody
from scheduler.services.login_codes import exchange_login_code, issue_login_code

router = APIRouter(prefix="/v1/auth", tags=["auth"], responses=ERROR_RESPONSES)


class LoginCodeCreated(BaseModel):
    code: str = Field(description="Good for one sign-in within `expires_in` seconds: `<url>/#code=<code>`.")
    expires_in: int


class SessionCreate(RequestBody):
    code: str = Field(max_length=400)


class SessionCreated(BaseModel):
    key: str = Field(description="An API key of the code's key's role and team; keep it like a password.")
    key_id: str
    role: str
    team_id: str | None
    expires_at: datetime


@router.post("/login-codes", response_model=LoginCodeCreated, status_code=201)
def create_login_code(principal: PrincipalDep, settings: SettingsDep, audit: AuditDep) -> LoginCodeCreated:
    """A one-time code that signs a browser in to the dashboard as this key (`relaxctl dashboard`)."""
    created = issue_login_code(settings.signing_key(), principal)
    audit.note(target=principal.key_id)
    return LoginCodeCreated(code=created.code, expires_in=created.expires_in)


@router.post("/sessions", response_model=SessionCreated, status_code=201)
def create_session(
    body: SessionCreate, session: SessionDep, settings: SettingsDep, audit: AuditDep
) -> SessionCreated:
    """Exchange a login code (once) for a session key; every refusal is the same 401."""
    key, raw = exchange_login_code(session, settings.signing_key(), body.code)
    audit.caller(key.created_by or key.id, key.role, key.team_id)
    audit.note(target=key.id)
    assert key.expires_at is not None
    return SessionCreated(
        key=raw, key_id=key.id, role=key.role, team_id=key.team_id, expires_at=key.expires_at
    )
