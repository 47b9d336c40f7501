"""Roles, team grants, key expiry and revocation, what each team sees, /metrics and the audit log
(SQLite and PostgreSQL). The route-by-route matrix is tests/integration/test_isolation.py; these are
the escapes of the trust issue, one test each."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.db.models import Allocation, ApiKey, AuditEvent, Team, utcnow
from scheduler.domain.jobs import JobStatus
from scheduler.services.auth import find_api_key
from scheduler.services.lifecycle import JobLifecycle
from tests.factories import grpo_spec, make_job


# Helpers -----------------------------------------------------------------------------------------
def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _team(client: TestClient, name: str, *, queue: str | None = None) -> str:
    r = client.post("/v1/teams", json={"name": name})
    assert r.status_code == 201, r.text
    q = client.post(
        "/v1/queues", json={"name": queue or f"{name}-q", "pool": "local", "team": name, "nominal_gpus": 1}
    )
    assert q.status_code == 201, q.text
    return r.json()["id"]


def _key(client: TestClient, team: str | None, role: str = "member", **extra: Any) -> str:
    r = client.post("/v1/api-keys", json={"name": f"{team}-{role}", "role": role, "team": team, **extra})
    assert r.status_code == 201, r.text
    return r.json()["key"]


def _spec(settings, team_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A valid spec whose model and data lie in the team's own area (created here)."""
    area = settings.artifacts / "teams" / team_id
    (area / "models" / "tiny").mkdir(parents=True, exist_ok=True)
    (area / "data").mkdir(parents=True, exist_ok=True)
    (area / "data" / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    return grpo_spec(
        **{"hf-checkpoint": "artifacts://models/tiny", "prompt-data": "artifacts://data/train.jsonl"}
    )


def _audit(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    r = client.get("/v1/admin/audit", params=params)
    assert r.status_code == 200, r.text
    return r.json()["data"]


@pytest.fixture
def math(api):  # type: ignore[no-untyped-def]
    """Team math (queue math-q) with a member key, and team vision (queue vision-q)."""
    client, settings, _ = api
    math_id = _team(client, "math")
    _team(client, "vision")
    return client, settings, math_id, _key(client, "math")


# Priority classes and queues ---------------------------------------------------------------------
def test_the_non_preemptible_class_needs_a_grant(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, math_id, member = math
    body = {"spec": _spec(settings, math_id)}
    r = client.post("/v1/jobs", json=body | {"priority_class": "high"}, headers=_as(member))
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["code"] == "priority_class.not_granted" and "'high'" in err["message"]
    issue = err["details"]["issues"][0]
    assert (
        issue["field"] == "priority_class"
        and "use normal, low;" in issue["hint"]
        and "relaxctl admin teams set" in issue["hint"]
    )
    assert (
        client.post("/v1/jobs", json=body | {"priority_class": "low"}, headers=_as(member)).status_code == 201
    )
    # an admin grants it (and takes `low` away)
    r = client.patch("/v1/teams/math", json={"allowed_priority_classes": ["normal", "high"]})
    assert r.status_code == 200 and r.json()["priority_classes"] == ["high", "normal"]
    job = client.post("/v1/jobs", json=body | {"priority_class": "high"}, headers=_as(member))
    assert job.status_code == 201 and (job.json()["priority_class"], job.json()["preemptible"]) == (
        "high",
        False,
    )
    assert (
        client.post("/v1/jobs", json=body | {"priority_class": "low"}, headers=_as(member)).status_code == 403
    )
    # a grant without `normal`: a job that names no class gets the team's highest granted one
    client.patch("/v1/teams/math", json={"allowed_priority_classes": ["low"]})
    assert client.post("/v1/jobs", json=body, headers=_as(member)).json()["priority_class"] == "low"
    # null resets to the default; an unknown class in a grant is refused by name
    assert client.patch("/v1/teams/math", json={"allowed_priority_classes": None}).json()[
        "priority_classes"
    ] == [
        "normal",
        "low",
    ]
    bad = client.patch("/v1/teams/math", json={"allowed_priority_classes": ["vip"]})
    assert bad.status_code == 422 and "'vip'" in bad.json()["error"]["message"]
    # only admins set grants; admins are not bound by a team's grant
    assert (
        client.patch(
            "/v1/teams/math", json={"allowed_priority_classes": ["high"]}, headers=_as(member)
        ).status_code
        == 403
    )
    assert client.post("/v1/jobs", json=body | {"team": "math", "priority_class": "high"}).status_code == 201


def test_queues_of_other_teams_need_a_grant_and_cannot_be_probed(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, math_id, member = math
    body = {"spec": _spec(settings, math_id)}
    other = client.post("/v1/jobs", json=body | {"queue": "vision-q"}, headers=_as(member))
    missing = client.post("/v1/jobs", json=body | {"queue": "no-such-q"}, headers=_as(member))
    assert other.status_code == missing.status_code == 403
    assert other.json()["error"]["code"] == missing.json()["error"]["code"] == "queue.not_granted"
    hint = other.json()["error"]["details"]["issues"][0]["hint"]
    assert "math-q" in hint and "vision" not in hint.replace("vision-q", "")
    # the dry run answers the same
    assert (
        client.post("/v1/specs/validate", json=body | {"queue": "vision-q"}, headers=_as(member)).status_code
        == 403
    )
    assert [q["name"] for q in client.get("/v1/queues", headers=_as(member)).json()["data"]] == ["math-q"]
    # granted: the team submits there and sees the queue
    team = client.patch("/v1/teams/math", json={"allowed_queues": ["vision-q"]}).json()
    assert team["queues"] == ["math-q", "vision-q"]
    job = client.post("/v1/jobs", json=body | {"queue": "vision-q"}, headers=_as(member))
    assert job.status_code == 201 and job.json()["queue"] == "vision-q"
    assert [q["name"] for q in client.get("/v1/queues", headers=_as(member)).json()["data"]] == [
        "math-q",
        "vision-q",
    ]
    # the default queue is the team's own
    assert client.post("/v1/jobs", json=body, headers=_as(member)).json()["queue"] == "math-q"
    assert client.patch("/v1/teams/math", json={"allowed_queues": ["nope"]}).status_code == 422


def test_a_team_key_acts_for_its_own_team_only(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, math_id, member = math
    body = {"spec": _spec(settings, math_id)}
    vision = client.post("/v1/jobs", json=body | {"team": "vision"}, headers=_as(member))
    nobody = client.post("/v1/jobs", json=body | {"team": "no-such-team"}, headers=_as(member))
    assert vision.status_code == nobody.status_code == 403
    assert vision.json()["error"]["message"] == nobody.json()["error"]["message"]
    assert client.post("/v1/jobs", json=body | {"team": "math"}, headers=_as(member)).status_code == 201


def test_a_viewer_reads_and_dry_runs_but_changes_nothing(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, math_id, member = math
    viewer = _key(client, "math", "viewer")
    body = {"spec": _spec(settings, math_id)}
    job = client.post("/v1/jobs", json=body, headers=_as(member)).json()
    assert client.get(f"/v1/jobs/{job['id']}", headers=_as(viewer)).status_code == 200
    assert client.get(f"/v1/jobs/{job['id']}/logs", headers=_as(viewer)).status_code == 200
    assert [j["id"] for j in client.get("/v1/jobs", headers=_as(viewer)).json()["data"]] == [job["id"]]
    assert client.post("/v1/specs/validate", json=body, headers=_as(viewer)).json()["valid"] is True
    r = client.post("/v1/jobs", json=body, headers=_as(viewer))
    assert r.status_code == 403 and "viewer" in r.json()["error"]["message"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=_as(viewer)).status_code == 403
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=_as(member)).status_code == 202


# Keys --------------------------------------------------------------------------------------------
def test_expired_and_revoked_keys_are_refused_saying_so_only_to_their_holder(math) -> None:  # type: ignore[no-untyped-def]
    client, _, _, member = math
    short = client.post("/v1/api-keys", json={"name": "ci", "team": "math", "expires_in_days": 1}).json()
    assert short["expires_at"] and "key" in short
    assert client.get("/v1/jobs", headers=_as(short["key"])).status_code == 200
    with client.app.state.db.session() as s:
        s.get(ApiKey, short["id"]).expires_at = utcnow() - timedelta(seconds=1)
    r = client.get("/v1/jobs", headers=_as(short["key"]))
    assert r.status_code == 401 and r.json()["error"]["code"] == "auth.key_expired"
    assert client.delete(f"/v1/api-keys/{_id_of(client, member)}").status_code == 200
    r = client.get("/v1/jobs", headers=_as(member))
    assert r.status_code == 401 and r.json()["error"]["code"] == "auth.key_revoked"
    unknown = client.get("/v1/jobs", headers=_as("rlx_" + "x" * 43)).json()["error"]
    assert unknown["code"] == "unauthenticated" and unknown["details"] is None
    # an expiry must lie ahead, and only one way of giving it
    assert (
        client.post(
            "/v1/api-keys", json={"name": "x", "team": "math", "expires_at": "2001-01-01T00:00:00Z"}
        ).status_code
        == 422
    )
    both = {"name": "x", "team": "math", "expires_in_days": 1, "expires_at": "2099-01-01T00:00:00Z"}
    assert client.post("/v1/api-keys", json=both).status_code == 422


def _id_of(client: TestClient, raw: str) -> str:
    with client.app.state.db.session(read_only=True) as s:
        key = find_api_key(s, raw)
        assert key is not None
        return key.id


def test_a_team_admin_manages_its_teams_keys_and_no_others(math) -> None:  # type: ignore[no-untyped-def]
    client, _, math_id, member = math
    lead = _key(client, "math", "team_admin")
    vision_key = client.post("/v1/api-keys", json={"name": "v", "team": "vision"}).json()
    made = client.post("/v1/api-keys", json={"name": "new", "role": "viewer"}, headers=_as(lead))
    assert made.status_code == 201 and made.json()["team_id"] == math_id and made.json()["role"] == "viewer"
    assert (
        client.post("/v1/api-keys", json={"name": "a", "role": "admin"}, headers=_as(lead)).status_code == 403
    )
    other = client.post("/v1/api-keys", json={"name": "v", "team": "vision"}, headers=_as(lead))
    nobody = client.post("/v1/api-keys", json={"name": "v", "team": "nobody"}, headers=_as(lead))
    assert other.status_code == nobody.status_code == 403
    assert other.json()["error"]["message"] == nobody.json()["error"]["message"]
    # the list: the team's keys, never a secret
    listed = client.get("/v1/api-keys", headers=_as(lead)).json()["data"]
    assert {k["team_id"] for k in listed} == {math_id} and all("key" not in k for k in listed)
    assert vision_key["id"] not in {k["id"] for k in listed}
    assert client.get("/v1/api-keys", params={"team": "vision"}, headers=_as(lead)).status_code == 403
    # revoke: the team's keys yes, another team's is not found, a member may revoke only its own
    assert client.delete(f"/v1/api-keys/{made.json()['id']}", headers=_as(lead)).status_code == 200
    assert client.delete(f"/v1/api-keys/{vision_key['id']}", headers=_as(lead)).status_code == 404
    assert client.delete("/v1/api-keys/key_nonexistent", headers=_as(lead)).status_code == 404
    lead_id = _id_of(client, lead)
    assert client.delete(f"/v1/api-keys/{lead_id}", headers=_as(member)).status_code == 403
    assert client.delete(f"/v1/api-keys/{_id_of(client, member)}", headers=_as(member)).status_code == 200


# What a team sees --------------------------------------------------------------------------------
def test_pools_show_a_team_its_own_jobs_and_only_counts_of_others(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, _, member = math
    db = client.app.state.db
    mine = make_job(db, queue="math-q", name="mine", artifact_root=settings.artifacts)
    theirs = make_job(db, queue="vision-q", name="theirs", artifact_root=settings.artifacts)
    with db.session() as s:
        svc = JobLifecycle(s)
        for job_id in (mine, theirs):
            svc.transition(job_id, JobStatus.ADMITTED, expected_from=JobStatus.QUEUED, reason="test")
            s.add(Allocation(job_id=job_id, pool="local", node="node-0", role="actor", gpus=1))
    seen = client.get("/v1/pools", headers=_as(member)).json()["data"][0]
    assert seen["ray_address"] is None
    node = seen["nodes"][0]
    assert (
        node["jobs"] == [{"job_id": mine, "gpus": 1}]
        and node["other_gpus"] == 1
        and node["allocated_gpus"] == 2
    )
    assert theirs not in json.dumps(seen) and "vision" not in json.dumps(seen)
    full = client.get("/v1/pools").json()["data"][0]
    assert full["ray_address"] and {j["job_id"] for j in full["nodes"][0]["jobs"]} == {mine, theirs}
    assert full["nodes"][0]["other_gpus"] == 0
    assert client.get(f"/v1/jobs/{theirs}", headers=_as(member)).status_code == 404
    teams = client.get("/v1/teams", headers=_as(member)).json()["data"]
    assert [t["name"] for t in teams] == ["math"] and client.get(
        "/v1/teams/vision", headers=_as(member)
    ).status_code == 404


def test_metrics_need_an_admin_key_or_the_scrape_token(api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    _team(client, "math")
    member = _key(client, "math")
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401
    assert client.get("/metrics", headers=_as(member)).status_code == 403
    monkeypatch.setattr(settings.api, "metrics_token", "scrape-secret")
    r = client.get("/metrics", headers=_as("scrape-secret"))
    assert r.status_code == 200 and "relax_pool_gpus" in r.text
    assert client.get("/metrics", headers=_as("scrape-wrong")).status_code == 401


# The audit log -----------------------------------------------------------------------------------
def test_every_mutating_call_is_audited_with_who_what_and_how_it_ended(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, math_id, member = math
    member_id = _id_of(client, member)
    body = {"spec": _spec(settings, math_id), "name": "audited"}
    job = client.post("/v1/jobs", json=body, headers=_as(member)).json()
    client.post("/v1/jobs", json=body | {"priority_class": "high"}, headers=_as(member))  # 403
    client.post("/v1/jobs", json={"nonsense": 1}, headers=_as(member))  # 422 before the route runs
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=_as("rlx_unknown"))  # 401
    client.get("/v1/jobs", headers=_as(member))  # reads are not audited
    created = client.post("/v1/api-keys", json={"name": "robot", "team": "math"}).json()

    rows = _audit(client, key=member_id)
    assert [(e["path"], e["status_code"]) for e in rows] == [
        ("/v1/jobs", 422),
        ("/v1/jobs", 403),
        ("/v1/jobs", 201),
    ]
    ok, refused, invalid = rows[2], rows[1], rows[0]
    assert (ok["key_id"], ok["role"], ok["team_id"], ok["method"]) == (member_id, "member", math_id, "POST")
    assert ok["target"] == job["id"] and ok["request_id"]
    assert ok["details"]["name"] == "audited"
    assert ok["details"]["queue"] == "math-q" and ok["details"]["priority_class"] == "normal"
    assert refused["details"]["priority_class"] == "high"
    assert refused["details"]["error"] == "priority_class.not_granted"
    assert invalid["details"]["error"] == "request.invalid"
    (anonymous,) = _audit(client, path="/v1/jobs/{job_id}/cancel")
    assert (anonymous["key_id"], anonymous["status_code"], anonymous["target"]) == (None, 401, job["id"])
    made = _audit(client, path="/v1/api-keys")[0]
    assert made["target"] == created["id"] and made["details"]["role"] == "member"
    everything = json.dumps(_audit(client, limit=1000))
    assert created["key"] not in everything and member not in everything  # no secret in the log
    # filters and cursor pages
    assert {e["team_id"] for e in _audit(client, team="math")} == {math_id}
    first = client.get("/v1/admin/audit", params={"limit": 2}).json()
    second = client.get("/v1/admin/audit", params={"limit": 2, "after": first["next_cursor"]}).json()
    assert first["next_cursor"] and second["data"][0]["id"] < first["data"][-1]["id"]
    assert _audit(client, since=(utcnow() + timedelta(hours=1)).isoformat()) == []
    assert client.get("/v1/admin/audit", headers=_as(member)).status_code == 403


def test_an_expired_keys_refusal_names_the_key_in_the_audit_log(math) -> None:  # type: ignore[no-untyped-def]
    client, _, math_id, member = math
    with client.app.state.db.session() as s:
        key = s.scalar(sa.select(ApiKey).where(ApiKey.team_id == math_id))
        key.expires_at = utcnow() - timedelta(days=1)
        key_id = key.id
    assert client.post("/v1/specs/validate", json={"args": []}, headers=_as(member)).status_code == 401
    (row,) = _audit(client, key=key_id)
    assert (row["status_code"], row["role"], row["details"]["error"]) == (401, "member", "auth.key_expired")


def test_a_submission_without_a_valid_key_is_refused_401_whatever_its_body(math) -> None:  # type: ignore[no-untyped-def]
    """`POST /v1/jobs` looks its caller up in its own route (api/deps.py::caller_in_route): a body refused
    before the route runs is still answered 401 for a missing, unknown or expired key, and 422 only for a
    valid one; the expired key is named in the audit row."""
    client, _, math_id, member = math
    bad = {"nonsense": 1}
    missing = client.post("/v1/jobs", json=bad, headers={"Authorization": ""})
    assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
    assert client.post("/v1/jobs", json=bad, headers=_as("rlx_unknown")).status_code == 401
    assert client.post("/v1/jobs", json=bad, headers=_as(member)).status_code == 422
    with client.app.state.db.session() as s:
        key = s.scalar(sa.select(ApiKey).where(ApiKey.team_id == math_id))
        key.expires_at = utcnow() - timedelta(days=1)
        key_id = key.id
    expired = client.post("/v1/jobs", json=bad, headers=_as(member))
    assert (expired.status_code, expired.json()["error"]["code"]) == (401, "auth.key_expired")
    assert [(r["status_code"], r["details"]["error"]) for r in _audit(client, key=key_id)] == [
        (401, "auth.key_expired"),
        (422, "request.invalid"),
    ]


def test_the_audit_row_commits_with_the_change_or_not_at_all(math, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """When the row cannot be written with the change, the change is rolled back and the failure is
    recorded on its own."""
    client, *_ = math
    import api.audit

    real, calls = api.audit.record, []

    def failing_once(session, entry, status):  # type: ignore[no-untyped-def]
        calls.append(status)
        if len(calls) == 1:
            raise RuntimeError("audit storage broke")
        return real(session, entry, status)

    monkeypatch.setattr(api.audit, "record", failing_once)
    with TestClient(client.app, raise_server_exceptions=False) as c:
        r = c.post("/v1/teams", json={"name": "ghost"}, headers=dict(client.headers))
    assert r.status_code == 500 and calls == [201, 500]
    with client.app.state.db.session(read_only=True) as s:
        assert s.scalar(sa.select(Team).where(Team.name == "ghost")) is None
        rows = s.scalars(sa.select(AuditEvent).where(AuditEvent.path == "/v1/teams")).all()
    assert [(e.status_code, e.details.get("name")) for e in rows][-1] == (500, "ghost")


def test_driver_routes_are_not_audited(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    client.post("/v1/internal/jobs/job_nope/report", json={"attempt": 1, "seq": 0})
    client.get("/v1/jobs/job_nope")
    assert _audit(client) == []


def test_a_stream_ends_when_its_key_is_revoked(math) -> None:  # type: ignore[no-untyped-def]
    client, settings, _, member = math
    db = client.app.state.db
    job_id = make_job(db, queue="math-q", name="watched", artifact_root=settings.artifacts)
    kinds = []
    with client.stream("GET", f"/v1/jobs/{job_id}/stream", headers=_as(member)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event:"):
                kinds.append(line.split(":", 1)[1].strip())
                if len(kinds) == 1:
                    assert client.delete(f"/v1/api-keys/{_id_of(client, member)}").status_code == 200
    assert (
        kinds[0] == "status" and "end" not in kinds
    )  # closed without `end`: the client reconnects, gets 401
    assert client.get(f"/v1/jobs/{job_id}/stream", headers=_as(member)).status_code == 401


def test_a_long_request_id_does_not_break_the_audit_row(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/teams", json={"name": "long"}, headers={"X-Request-ID": "r" * 300})
    assert r.status_code == 201
    assert _audit(client, path="/v1/teams")[0]["request_id"] == "r" * 64
