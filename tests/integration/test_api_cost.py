"""What a submission and a listing cost the database, and that the cheaper ways they are written keep their
results: the job row read back is the job the 201 answered, the job `JobSubmission.submit` returns is the
session's own, and the list's filters select what they name."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from scheduler.db.models import AuditEvent, Job, JobEvent
from scheduler.services.auth import Principal
from scheduler.services.submission import JobSubmission, Submission
from tests.factories import grpo_spec


def _member(client) -> dict[str, str]:  # type: ignore[no-untyped-def]
    r = client.post("/v1/api-keys", json={"name": "ci", "role": "member", "team": "default"})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}


def _statements(engine: sa.Engine, in_transaction: list[bool] | None = None) -> list[str]:
    """The statements run from now on; with `in_transaction`, whether a transaction was open after each
    (PostgreSQL: psycopg's transaction status, INTRANS against IDLE)."""
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    if in_transaction is not None:

        def after(conn, *_):  # type: ignore[no-untyped-def]
            status = conn.connection.dbapi_connection.info.transaction_status
            in_transaction.append(status.name != "IDLE")

        sa.event.listen(engine, "after_cursor_execute", after)
    return seen


def test_a_submission_reads_and_writes_in_three_statements(api) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL (no transaction: `defer_begin`, so no BEGIN nor COMMIT): the key with its team; the queue
    named, the priority classes, the nodes, the team's grants and endpoints and the job with the idempotency key
    (one statement); the job with its event and the call's audit row (one statement, committing itself).
    (SQLite judges in a read-only unit of work first, and reads again in the write one; it writes the job, its
    event and the audit row in three statements.)"""
    client, _, _ = api
    db = client.app.state.db
    member = _member(client)
    client.post("/v1/jobs", json={"spec": grpo_spec()}, headers=member)  # warm: nothing else is read once
    in_transaction: list[bool] = []
    seen = _statements(db.engine, in_transaction if db.dialect == "postgresql" else None)
    r = client.post(
        "/v1/jobs",
        json={"name": "counted", "queue": "default", "spec": grpo_spec()},
        headers=member | {"Idempotency-Key": "counted-1"},
    )
    assert r.status_code == 201, r.text
    kinds = [" ".join(s.split()[:4]) for s in seen]
    writes = [k for k in kinds if k.startswith(("INSERT", "WITH"))]
    if db.dialect == "postgresql":  # the job, its event and the audit row in one statement
        assert writes == ["WITH new_job AS (INSERT"], kinds
        assert "new_audit AS (INSERT INTO audit_events" in " ".join(seen[kinds.index(writes[0])].split())
        assert len([k for k in kinds if k.startswith("SELECT")]) == 2, kinds
        assert in_transaction == [False, False, False]  # each statement committed (or read) on its own
    else:
        assert writes == [
            "INSERT INTO jobs (id,",
            "INSERT INTO job_events (job_id,",
            "INSERT INTO audit_events (time,",
        ]
    body = r.json()
    with db.session(read_only=True) as s:
        job = s.get(Job, body["id"])
        assert job is not None
        assert (
            job.spec == body["spec"] and job.demand == body["demand"] and job.submitted == body["submitted"]
        )
        assert (job.status, job.name, job.queue, job.priority_class) == (
            "QUEUED",
            "counted",
            "default",
            "normal",
        )
        for column in ("created_at", "updated_at", "queued_at", "status_changed_at"):
            assert getattr(job, column) is not None
        assert (job.attempt, job.preemptions, job.report_seq, job.service_gpu_s) == (0, 0, -1, 0.0)
        events = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job.id)).all()
        assert [(e.kind, e.from_status, e.to_status) for e in events] == [("transition", None, "QUEUED")]
        audit = s.scalars(sa.select(AuditEvent).where(AuditEvent.target == job.id)).all()
        assert [(a.method, a.path, a.status_code, a.details["name"]) for a in audit] == [
            ("POST", "/v1/jobs", 201, "counted")
        ]


def test_the_audit_row_written_with_the_job_and_a_repeat_audited_on_its_own(api) -> None:  # type: ignore[no-untyped-def]
    """A created job's audit row is written in the job's statement (PostgreSQL) with what the route noted
    before; a repeated idempotency key creates nothing, and its call is audited as before (200, created
    false, the same target)."""
    client, _, _ = api
    member = _member(client)
    headers = member | {"Idempotency-Key": "audit-once"}
    first = client.post("/v1/jobs", json={"name": "once", "spec": grpo_spec()}, headers=headers)
    again = client.post("/v1/jobs", json={"name": "once", "spec": grpo_spec()}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    with client.app.state.db.session(read_only=True) as s:
        rows = s.scalars(
            sa.select(AuditEvent).where(AuditEvent.target == first.json()["id"]).order_by(AuditEvent.id)
        ).all()
    assert [(a.status_code, a.details["created"], a.details["name"], a.details["queue"]) for a in rows] == [
        (201, True, "once", "default"),
        (200, False, "once", "default"),
    ]
    assert all(a.key_id and a.role == "member" and a.request_id and a.path == "/v1/jobs" for a in rows)


def test_the_submitted_job_is_the_sessions_own(db_url: str, tmp_path: Path) -> None:
    """`submit` writes the row with one INSERT and hands back the session's object of it: every column as
    stored, and a change to it is written by the commit."""
    from scheduler.db.engine import Database
    from tests.factories import bootstrap

    db = Database(db_url)
    try:
        bootstrap(db, tmp_path)
        admin = Principal(key_id="key_test", role="admin", team_id=None)
        with db.session() as s:
            svc = JobSubmission(s, artifact_root=tmp_path / "artifacts", home=tmp_path)
            job, created = svc.submit(admin, Submission(spec=grpo_spec(), labels={"a": "b"}))
            assert created and s.get(Job, job.id) is job
            written = {c.key: getattr(job, c.key) for c in Job.__table__.columns}
            job.ray_submission_id = "changed-after-submit"
        with db.session(read_only=True) as s:
            stored = s.get(Job, job.id)
            assert (
                stored.ray_submission_id == "changed-after-submit"
                and stored.updated_at > written["updated_at"]
            )
            changed = ("ray_submission_id", "updated_at")
            assert {c.key: getattr(stored, c.key) for c in Job.__table__.columns if c.key not in changed} == {
                k: v for k, v in written.items() if k not in changed
            }
            assert stored.labels == {"a": "b"} and stored.status == "QUEUED"
    finally:
        db.dispose()


# (query, the names it lists, newest first) over the three jobs of test_list_filters
LIST_FILTERS = [
    ("", ["c", "b", "a"]),
    ("?status=QUEUED", ["c", "a"]),
    ("?status=CANCELLED,QUEUED", ["c", "b", "a"]),
    ("?status=cancelled", ["b"]),
    ("?name=a", ["a"]),
    ("?queue=default&status=QUEUED&limit=1", ["c"]),
    ("?queue=elsewhere", []),
]


def test_list_filters(api, subtests) -> None:  # type: ignore[no-untyped-def]
    """Every filter of LIST_FILTERS over the same three jobs, each a subtest of its own (the jobs are made once:
    listing changes nothing; a platform and three submissions per filter cost ~2.5 s each)."""
    client, _, _ = api
    member = _member(client)
    ids = {}
    for name in ("a", "b", "c"):
        r = client.post("/v1/jobs", json={"name": name, "spec": grpo_spec()}, headers=member)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    assert client.post(f"/v1/jobs/{ids['b']}/cancel", headers=member).status_code == 202
    for query, names in LIST_FILTERS:
        with subtests.test(query=query):
            page = client.get("/v1/jobs" + query, headers=member).json()
            assert [j["name"] for j in page["data"]] == names
    # the admin sees the same jobs; a page ends where the next begins
    first = client.get("/v1/jobs?limit=2").json()
    assert [j["name"] for j in first["data"]] == ["c", "b"] and first["next_cursor"] == ids["b"]
    rest = client.get(f"/v1/jobs?limit=2&after={first['next_cursor']}").json()
    assert [j["name"] for j in rest["data"]] == ["a"] and rest["next_cursor"] is None


def test_submit_fast_path_answers_as_fastapis_handler(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`POST /v1/jobs` with a plain JSON body is served past FastAPI's handler (api.routes.jobs
    `_fast_submit_app`); any other body goes through it. Both give the same answers: 201 with the job, 200 for a
    repeated Idempotency-Key, and the same 422 for a refused body (its field named)."""
    import json

    from api.routes import jobs

    client, _, _ = api
    member = _member(client)
    fast: list[bool] = []
    judged = jobs._fast_fields
    monkeypatch.setattr(jobs, "_fast_fields", lambda s, b: fast.append((r := judged(s, b)) is not None) or r)

    def post(body: object, content_type: str, key: str | None = None):  # type: ignore[no-untyped-def]
        headers = {**member, "Content-Type": content_type} | ({"Idempotency-Key": key} if key else {})
        return client.post("/v1/jobs", content=json.dumps(body), headers=headers)

    answers = {}
    for i, content_type in enumerate(("application/json", "application/json; charset=utf-8")):
        fast.clear()
        created = post({"spec": grpo_spec(), "name": f"j{i}"}, content_type, key=content_type)
        again = post({"spec": grpo_spec(), "name": f"j{i}"}, content_type, key=content_type)
        refused = post({"spec": grpo_spec(), "nmae": "j"}, content_type)
        long_key = post({"spec": grpo_spec()}, content_type, key="k" * 201)
        no_key = client.post(
            "/v1/jobs",
            content=json.dumps({"spec": grpo_spec()}),
            headers={"Content-Type": content_type, "Authorization": ""},
        )
        assert fast == (
            [True, True, False, False, True] if content_type == "application/json" else [False] * 5
        )
        assert (created.status_code, again.status_code) == (201, 200), created.text
        assert again.json()["id"] == created.json()["id"]
        assert created.headers["content-type"] == "application/json" and created.headers.get("x-request-id")
        answers[content_type] = (
            sorted(created.json()),
            created.json()["spec"] == again.json()["spec"],
            refused.status_code,
            {k: v for k, v in refused.json()["error"].items() if k != "request_id"},
            long_key.status_code,
            long_key.json()["error"]["details"],
            no_key.status_code,
            no_key.json()["error"]["code"],
        )
    assert answers["application/json"] == answers["application/json; charset=utf-8"]
    assert answers["application/json"][2] == 422 and answers["application/json"][4] == 422
    assert answers["application/json"][6] == 401
