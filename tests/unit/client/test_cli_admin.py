"""`relaxctl admin teams|create-key|keys|revoke-key|audit` against a recording fake API client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

import client.cli as cli
import client.commands as commands

TEAM = {
    "id": "team_1",
    "name": "math",
    "allowed_priority_classes": None,
    "allowed_queues": ["vision-q"],
    "priority_classes": ["normal", "low"],
    "queues": ["math-q", "vision-q"],
}


class FakeClient:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def teams(self) -> list[dict[str, Any]]:
        return [TEAM]

    def update_team(self, team: str, **changes: Any) -> dict[str, Any]:
        self.calls.append(("update_team", (team, changes)))
        return TEAM | {"priority_classes": changes.get("allowed_priority_classes") or ["normal", "low"]}

    def create_api_key(self, name: str, **kw: Any) -> dict[str, Any]:
        self.calls.append(("create_api_key", (name, kw)))
        return {"id": "key_1", "role": kw["role"], "key": "rlx_secret", "expires_at": kw.get("expires_at")}

    def api_keys(self, team: str | None = None) -> list[dict[str, Any]]:
        return [
            {
                "id": "key_1",
                "name": "ci",
                "role": "member",
                "team_id": "team_1",
                "prefix": "rlx_abcdef",
                "created_at": "2026-12-01T00:00:00Z",
                "expires_at": None,
                "revoked_at": None,
            }
        ]

    def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        self.calls.append(("revoke", key_id))
        return {"id": key_id, "name": "ci"}

    def audit(self, **filters: Any) -> dict[str, Any]:
        self.calls.append(("audit", filters))
        row = {
            "time": "2026-12-01T00:00:00Z",
            "key_id": "key_1",
            "role": "member",
            "method": "POST",
            "path": "/v1/jobs",
            "target": "job_1",
            "status_code": 403,
            "details": {"priority_class": "high", "error": "priority_class.not_granted"},
        }
        return {"data": [row], "next_cursor": None}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    recorded: list[tuple[str, Any]] = []
    monkeypatch.setattr(commands, "connect", lambda url, key: FakeClient(recorded))
    return recorded


def invoke(*argv: str) -> Any:
    return CliRunner().invoke(cli.app, ["admin", *argv])


def test_teams_set_sends_the_grants(calls: list) -> None:
    r = invoke("teams", "set", "math", "--priority-classes", "low, normal,high", "--queues", "default")
    assert r.exit_code == 0, r.output
    assert calls == [
        (
            "update_team",
            ("math", {"allowed_priority_classes": ["low", "normal", "high"], "allowed_queues": None}),
        )
    ]
    assert "priority classes low, normal, high" in r.output
    assert invoke("teams", "set", "math").exit_code == 2  # nothing to set


def test_teams_lists_what_each_team_may_use(calls: list) -> None:
    r = invoke("teams")
    assert r.exit_code == 0, r.output
    assert "math-q, vision-q" in r.output and "default: preemptible" in r.output


def test_create_key_with_an_expiry(calls: list) -> None:
    r = invoke("create-key", "ci", "--team", "math", "--role", "viewer", "--expires-in", "30d")
    assert r.exit_code == 0, r.output
    ((_, (name, kw)),) = calls
    assert (name, kw["role"], kw["team"]) == ("ci", "viewer", "math")
    expires = datetime.fromisoformat(kw["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    assert "rlx_secret" in r.output
    assert invoke("create-key", "ci", "--expires-in", "soon").exit_code == 2


def test_keys_revoke_and_audit(calls: list) -> None:
    r = invoke("keys", "--json")
    assert r.exit_code == 0 and "rlx_abcdef" in r.output and "rlx_secret" not in r.output
    assert invoke("keys").exit_code == 0
    assert invoke("revoke-key", "key_1").exit_code == 0 and ("revoke", "key_1") in calls
    r = invoke("audit", "--since", "2h", "--path", "/v1/jobs")
    assert r.exit_code == 0, r.output
    filters = calls[-1][1]
    since = datetime.fromisoformat(filters["since"])
    assert abs(since - (datetime.now(UTC) - timedelta(hours=2))) < timedelta(minutes=1)
    assert filters["path"] == "/v1/jobs" and "job_1" in r.output
