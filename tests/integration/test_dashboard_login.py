"""`relaxctl dashboard` and the one-time login codes behind it, over the real API and each database: the
key never reaches the link (a browser's command line, its history, the terminal), the code signs in
once, and what it opens is a session key of the same role and team that ends on time."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

import client.cli as cli
import client.commands as commands
from client.sdk import RelaxClient
from scheduler.db.models import ApiKey, utcnow
from scheduler.services import login_codes
from scheduler.services.auth import Principal, create_api_key
from scheduler.services.platform import ensure_team


def _cli_client(monkeypatch: pytest.MonkeyPatch, test_client: Any) -> None:
    """`relaxctl` talking to the in-process API through the test client's transport."""
    key = test_client.headers["Authorization"][7:]

    def make(url: str | None, api_key: str | None) -> RelaxClient:
        c = RelaxClient("http://testserver", api_key or key)
        c._http.close()
        c._http = test_client
        return c

    monkeypatch.setattr(commands, "connect", make)
    monkeypatch.setattr(RelaxClient, "close", lambda self: None)  # the test client outlives the command


def _exchange(client: Any, code: str) -> Any:
    return client.post("/v1/auth/sessions", json={"code": code}, headers={"Authorization": ""})


def test_relaxctl_dashboard_opens_a_one_time_link_without_the_key(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    key = client.headers["Authorization"][7:]
    _cli_client(monkeypatch, client)
    opened: list[str] = []
    import webbrowser

    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    result = CliRunner().invoke(cli.app, ["dashboard"])
    assert result.exit_code == 0, result.output
    (link,) = opened
    assert key not in link and key not in result.output
    assert link.startswith("http://testserver/#code=rlc_")
    code = link.split("#code=", 1)[1]

    # the code is no API key
    assert client.get("/v1/queues", headers={"Authorization": f"Bearer {code}"}).status_code == 401
    first = _exchange(client, code)
    assert first.status_code == 201, first.text
    session = first.json()
    assert session["key"].startswith("rlx_") and session["key"] != key and session["role"] == "admin"
    assert client.get("/v1/queues", headers={"Authorization": f"Bearer {session['key']}"}).status_code == 200
    again = _exchange(client, code)
    assert again.status_code == 401 and again.json()["error"]["code"] == "auth.bad_login_code"
    assert code not in again.text and session["key"] not in again.text

    # --no-browser prints a fresh link, again without the key
    result = CliRunner().invoke(cli.app, ["dashboard", "--no-browser"])
    assert result.exit_code == 0 and "#code=rlc_" in result.output and key not in result.output


def test_login_codes_expire_die_with_their_key_and_open_sessions_of_the_same_role(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    db = client.app.state.db
    with db.session() as s:
        team = ensure_team(s, "team-v")
        viewer, viewer_raw = create_api_key(
            s, name="v", role="viewer", team_id=team.id, expires_at=utcnow() + timedelta(hours=1)
        )
        viewer_id, team_id = viewer.id, team.id
    code = client.post("/v1/auth/login-codes", headers={"Authorization": f"Bearer {viewer_raw}"}).json()[
        "code"
    ]
    session = _exchange(client, code).json()
    assert session["role"] == "viewer" and session["team_id"] == team_id
    with db.session() as s:
        row = s.get(ApiKey, session["key_id"])
        assert row.created_by == viewer_id and row.expires_at <= utcnow() + timedelta(
            hours=1
        )  # no longer than its key
    # a viewer's session can read, not submit
    h = {"Authorization": f"Bearer {session['key']}"}
    assert client.get("/v1/queues", headers=h).status_code == 200
    assert client.post("/v1/jobs", json={"spec": {}}, headers=h).status_code == 403

    # expired: a code older than its time
    principal = Principal(key_id=viewer_id, role="viewer", team_id=team_id)
    old = login_codes.issue_login_code(
        settings.signing_key(), principal, now=time.time() - login_codes.LOGIN_CODE_TTL_S - 1
    )
    assert _exchange(client, old.code).status_code == 401
    # forged: signed with another key, or altered
    forged = login_codes.issue_login_code(b"not-the-platform-key", principal)
    assert _exchange(client, forged.code).status_code == 401
    fresh = login_codes.issue_login_code(settings.signing_key(), principal).code
    assert _exchange(client, fresh[:-1] + ("0" if fresh[-1] != "0" else "1")).status_code == 401
    # its key revoked meanwhile: the code dies with it
    with db.session() as s:
        s.get(ApiKey, viewer_id).revoked_at = utcnow()
    refused = _exchange(client, fresh)
    assert refused.status_code == 401
    bodies = {_exchange(client, c).text for c in (old.code, forged.code, fresh, "rlc_garbage", "")}
    assert len({b.replace(b[b.index('"request_id"') :], "") for b in bodies}) == 1  # one answer for all


def test_admin_key_is_0600_from_its_creation_in_a_0700_home(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The embedded platform's bootstrap admin key, whatever the umask of the process that makes it."""
    import os
    import stat

    from scheduler.db.engine import Database
    from tests.factories import bootstrap

    home = tmp_path / "relax-home"
    db = Database(db_url)
    old = os.umask(0)
    try:
        raw = bootstrap(db, home)
    finally:
        os.umask(old)
        db.dispose()
    key_file = home / "admin.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert key_file.read_text().strip() == raw
    assert not [p.name for p in home.iterdir() if p.name.endswith(".tmp")]  # no temporary copy left
    db = Database(db_url)
    try:
        assert bootstrap(db, home) == raw  # a restart reads it back
    finally:
        db.dispose()
