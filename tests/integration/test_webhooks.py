"""Webhooks end to end over each database: endpoints made through the API, a job's status changes making signed
deliveries, a real HTTP server in the test receiving them (http.server in a thread), retries on the configured
schedule, the delivery log, isolation between teams, `--notify-urls`, and a real Celery worker delivering."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.celery_app import worker_argv
from scheduler.db.engine import Database
from scheduler.db.models import Job, WebhookDelivery, utcnow
from scheduler.dispatch import TASK_TICK, CeleryDispatcher
from scheduler.domain import webhooks as wh
from scheduler.domain.jobs import FailureReason, JobStatus
from scheduler.services import platform
from scheduler.services.auth import Principal, create_api_key, team_for
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.webhook_delivery import DeliveryPool, deliver, lease_seconds, prune, sweep
from scheduler.settings import CelerySettings, DatabaseSettings, Settings, WebhookSettings
from tests.factories import bootstrap, grpo_spec, make_broker_app, make_job, seed_area

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A real HTTP server: records every POST and answers the next code of `codes` (then the last one)."""

    codes: list[int] = field(default_factory=lambda: [204])
    location: str | None = None
    gate: threading.Event | None = None  # when set up, it answers only once the gate opens
    got: list[Received] = field(default_factory=list)
    url: str = ""

    def answer(self) -> int:
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            rec.got.append(
                Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
            )
            code = rec.answer()
            if rec.gate is not None:
                rec.gate.wait(10)
            self.send_response(code)
            if rec.location:
                self.send_header("location", rec.location)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield rec
    server.shutdown()
    server.server_close()


@dataclass
class World:
    client: TestClient
    db: Database
    settings: Settings
    keys: dict[str, str]  # team name -> a member key of it
    home: Path

    def as_(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[team]}"}


def make_world(
    db_url: str, tmp_path: Path, *, allow_private: bool = True, retry: list[float] | None = None
) -> World:
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
        webhooks=WebhookSettings(
            allow_private_addresses=allow_private,
            retry_seconds=[0.2, 0.4] if retry is None else retry,
            timeout_seconds=2,
            max_endpoints_per_team=3,
        ),
    )
    db = Database(db_url)
    bootstrap(db, tmp_path)
    keys = {}
    with db.session() as s:
        for name in ("alpha", "omega"):
            team = platform.create_team(s, ADMIN, name)
            platform.create_queue(
                s, ADMIN, name=f"{name}-q", pool="local", team=name, nominal_gpus=1,
                borrowing_limit=None, lending_limit=None, weight=1.0,
            )  # fmt: skip
            _, keys[name] = create_api_key(s, name=f"{name}-member", role="member", team_id=team.id)
    app = create_app(
        settings, db=db, dispatcher=CeleryDispatcher(make_broker_app(settings.broker_url, tmp_path))
    )
    return World(TestClient(app), db, settings, keys, tmp_path)


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    with w.client:
        yield w
    w.db.dispose()


def _sqlite(tmp_path: Path) -> str:
    from tests.dbclone import migrated_sqlite

    return migrated_sqlite(tmp_path / "relax.db")  # a copy of one `upgrade()` migrated


@pytest.fixture
def sqlite_world(tmp_path: Path) -> Iterator[World]:
    """For what does not depend on the database (the HTTP side, the CLI): SQLite only, to keep the suite fast."""
    w = make_world(_sqlite(tmp_path), tmp_path)
    with w.client:
        yield w
    w.db.dispose()


def _run_job(
    w: World,
    queue: str,
    steps: list[tuple[str, str]],
    *,
    failure: FailureReason | None = None,
    spec: dict | None = None,
) -> str:
    job_id = make_job(w.db, queue=queue, name=f"{queue}-job", artifact_root=w.settings.artifacts)
    if spec is not None:
        with w.db.session() as s:
            s.get(Job, job_id).spec = spec
    with w.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in steps:
            assert svc.transition(
                job_id, JobStatus(dst), expected_from=JobStatus(src), reason=f"to {dst}",
                failure=failure if dst == "FAILED" else None,
            )  # fmt: skip
    return job_id


def _deliver_due(w: World) -> list[str]:
    """What the beat's tick and the task do, in this process: hand every due delivery to one attempt."""
    key = w.settings.signing_key()
    return sweep(w.db, w.settings.webhooks, lambda d: deliver(w.db, w.settings.webhooks, d, signing_key=key))


def _deliveries(w: World) -> list[WebhookDelivery]:
    with w.db.session(read_only=True) as s:
        rows = list(s.scalars(sa.select(WebhookDelivery).order_by(WebhookDelivery.id)))
        s.expunge_all()
        return rows


# ---------------------------------------------------------------------------------------------------------
def test_a_jobs_transitions_make_signed_deliveries(world: World, receiver: Receiver) -> None:
    w = world
    r = w.client.post(
        "/v1/webhooks", json={"url": receiver.url, "event_types": ["job.*"]}, headers=w.as_("alpha")
    )
    assert r.status_code == 201, r.text
    hook = r.json()
    secret = hook["secret"]
    assert secret.startswith("whsec_") and hook["team_id"] and hook["event_types"] == ["job.*"]
    only_failed = w.client.post(
        "/v1/webhooks",
        json={"url": receiver.url + "/failed", "event_types": ["job.failed"]},
        headers=w.as_("alpha"),
    ).json()
    # the secret is shown once: never again
    assert "secret" not in w.client.get(f"/v1/webhooks/{hook['id']}", headers=w.as_("alpha")).json()
    assert secret not in w.client.get("/v1/webhooks", headers=w.as_("alpha")).text

    job_id = _run_job(w, "alpha-q", [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING"),
                                     ("RUNNING", "SUCCEEDED")])  # fmt: skip
    # an omega job makes nothing for alpha's endpoints
    _run_job(w, "omega-q", [("QUEUED", "CANCELLED")])
    rows = _deliveries(w)
    assert [d.event_type for d in rows] == ["job.admitted", "job.starting", "job.running", "job.succeeded"]
    assert {d.endpoint_id for d in rows} == {hook["id"]}  # the job.failed-only endpoint wanted none

    sent = _deliver_due(w)
    assert len(sent) == 4 and len(receiver.got) == 4
    for got in receiver.got:
        ts = int(got.headers["webhook-timestamp"])
        assert abs(ts - time.time()) < 60
        assert got.headers["content-type"] == "application/json"
        # recomputed here, from the spec's formula
        assert wh.verify(secret, got.headers["webhook-id"], ts, got.body, got.headers["webhook-signature"])
        assert not wh.verify(
            secret, got.headers["webhook-id"], ts, got.body + b" ", got.headers["webhook-signature"]
        )
    last = json.loads(receiver.got[-1].body)
    assert last["type"] == "job.succeeded" and last["timestamp"].endswith("Z")
    assert last["data"] | {"team": None} == {
        "id": job_id, "name": "alpha-q-job", "team": None, "queue": "alpha-q", "status": "SUCCEEDED",
        "previous_status": "RUNNING", "reason": "to SUCCEEDED", "failure_reason": None,
    }  # fmt: skip
    assert {g.headers["webhook-id"] for g in receiver.got} == {d.id for d in rows}
    assert _deliver_due(w) == []  # delivered: nothing is due any more

    page = w.client.get(f"/v1/webhooks/{hook['id']}/deliveries?limit=3", headers=w.as_("alpha")).json()
    assert [d["event_type"] for d in page["data"]] == ["job.succeeded", "job.running", "job.starting"]
    assert {d["state"] for d in page["data"]} == {"delivered"} and page["data"][0]["last_status_code"] == 204
    rest = w.client.get(
        f"/v1/webhooks/{hook['id']}/deliveries", params={"after": page["next_cursor"]}, headers=w.as_("alpha")
    ).json()
    assert [d["event_type"] for d in rest["data"]] == ["job.admitted"] and rest["next_cursor"] is None
    assert (
        w.client.get(f"/v1/webhooks/{only_failed['id']}/deliveries", headers=w.as_("alpha")).json()["data"]
        == []
    )
    # the log keeps them for RELAX_WEBHOOK_RETENTION_DAYS: one that ended longer ago goes, nothing else
    with w.db.session() as s:
        s.get(WebhookDelivery, rows[0].id).finished_at = utcnow() - timedelta(days=31)
    assert prune(w.db, w.settings.webhooks) == 1
    assert [d.id for d in _deliveries(w)] == [d.id for d in rows[1:]]


def test_a_failing_receiver_is_retried_on_the_schedule_then_failed(world: World, receiver: Receiver) -> None:
    w = world
    receiver.codes = [500]
    hook = w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha")).json()
    _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")])
    started = time.monotonic()
    while time.monotonic() - started < 10:
        _deliver_due(w)
        if _deliveries(w)[0].state != "pending":
            break
        time.sleep(0.02)
    (d,) = _deliveries(w)
    assert (d.state, d.attempts, d.last_status_code) == ("failed", 3, 500), d.last_error
    assert "500" in d.last_error
    times = [g.at for g in receiver.got]
    assert len(times) == 3 and len({g.headers["webhook-id"] for g in receiver.got}) == 1
    waits = [b - a for a, b in zip(times, times[1:], strict=False)]
    # the schedule: 0.2 s, then 0.4 s (upper bounds generous: a loaded machine polls late)
    assert 0.2 <= waits[0] < 3 and 0.4 <= waits[1] < 3, waits

    # a manual retry sends it once more (same id), and this time it lands
    receiver.codes = [200]
    r = w.client.post(f"/v1/webhooks/{hook['id']}/deliveries/{d.id}/retry", headers=w.as_("alpha"))
    assert r.status_code == 202 and r.json()["state"] == "pending"
    again = w.client.post(f"/v1/webhooks/{hook['id']}/deliveries/{d.id}/retry", headers=w.as_("alpha"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "webhook_delivery.pending"
    _deliver_due(w)
    (d,) = _deliveries(w)
    assert (d.state, d.attempts, d.last_status_code) == ("delivered", 4, 200)
    assert receiver.got[-1].headers["webhook-id"] == d.id


def test_a_slow_receiver_holds_only_the_delivery_threads(sqlite_world: World, receiver: Receiver) -> None:
    """The worker's task hands the attempt to the process's webhook threads and returns at once; attempts beyond
    the backlog are left to the sweep."""
    w = sqlite_world
    receiver.gate = threading.Event()  # the receiver holds every request until the test opens it
    w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha"))
    _run_job(w, "alpha-q", [("QUEUED", "ADMITTED"), ("ADMITTED", "QUEUED")])
    first, second = (d.id for d in _deliveries(w))
    pool = DeliveryPool(
        w.db, w.settings.webhooks.model_copy(update={"threads": 1}), signing_key=w.settings.signing_key()
    )
    pool._slots = threading.BoundedSemaphore(1)  # a backlog of one, to see the bound
    assert pool.submit(first) is True
    assert pool.submit(second) is False  # full: the sweep sends it again later
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not receiver.got:
        time.sleep(0.01)
    # the request is at the receiver, unanswered: submit returned without waiting for it
    assert len(receiver.got) == 1 and [d.state for d in _deliveries(w)] == ["pending", "pending"]
    receiver.gate.set()
    while time.monotonic() < deadline and _deliveries(w)[0].state != "delivered":
        time.sleep(0.02)
    assert [d.state for d in _deliveries(w)] == ["delivered", "pending"]
    while time.monotonic() < deadline and not pool.submit(second):  # its slot is freed as the attempt ends
        time.sleep(0.02)
    while time.monotonic() < deadline and _deliveries(w)[1].state != "delivered":
        time.sleep(0.02)
    assert [d.state for d in _deliveries(w)] == ["delivered", "delivered"]


def test_an_attempt_lost_with_its_worker_is_sent_again_after_its_lease(
    sqlite_world: World, receiver: Receiver
) -> None:
    """A worker that died mid-attempt leaves its row claimed (attempt counted, due at the lease's end): the sweep
    leaves it alone until then, and sends it again after."""
    w = sqlite_world
    w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha"))
    _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")])
    (d,) = _deliveries(w)
    lease = timedelta(seconds=lease_seconds(w.settings.webhooks))
    claimed_at = utcnow() - timedelta(seconds=5)
    with w.db.session() as s:  # what deliver()'s claim wrote before its worker was SIGKILLed
        row = s.get(WebhookDelivery, d.id)
        row.attempts, row.last_attempt_at, row.next_attempt_at = 1, claimed_at, claimed_at + lease
        row.dispatched_at = claimed_at
    assert _deliver_due(w) == [] and receiver.got == []  # still in its lease
    with w.db.session() as s:  # the lease has run out
        row = s.get(WebhookDelivery, d.id)
        row.next_attempt_at, row.dispatched_at = claimed_at - timedelta(seconds=1), claimed_at - lease
    assert _deliver_due(w) == [d.id]
    (d,) = _deliveries(w)
    assert (d.state, d.attempts) == ("delivered", 2) and len(receiver.got) == 1


def test_redirects_are_not_followed(sqlite_world: World, receiver: Receiver) -> None:
    w = sqlite_world
    receiver.codes, receiver.location = [302], "http://169.254.169.254/latest/meta-data"
    w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha"))
    _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")])
    _deliver_due(w)
    (d,) = _deliveries(w)
    assert d.state == "pending" and d.last_status_code == 302 and "not followed" in d.last_error
    assert len(receiver.got) == 1


def test_teams_see_only_their_own(world: World, receiver: Receiver) -> None:
    w = world
    mine = w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha")).json()
    theirs = w.client.post(
        "/v1/webhooks", json={"url": receiver.url + "/omega"}, headers=w.as_("omega")
    ).json()
    _run_job(w, "omega-q", [("QUEUED", "CANCELLED")])
    (d,) = _deliveries(w)
    assert d.endpoint_id == theirs["id"]
    assert [h["id"] for h in w.client.get("/v1/webhooks", headers=w.as_("alpha")).json()["data"]] == [
        mine["id"]
    ]
    for method, path in (
        ("GET", f"/v1/webhooks/{theirs['id']}"),
        ("GET", f"/v1/webhooks/{theirs['id']}/deliveries"),
        ("POST", f"/v1/webhooks/{theirs['id']}/deliveries/{d.id}/retry"),
        ("POST", f"/v1/webhooks/{mine['id']}/deliveries/{d.id}/retry"),  # their delivery under my endpoint
        ("DELETE", f"/v1/webhooks/{theirs['id']}"),
    ):
        r = w.client.request(method, path, headers=w.as_("alpha"))
        assert r.status_code == 404, (method, path, r.text)
        assert "/omega" not in r.text and "payload" not in r.text
    r = w.client.post("/v1/webhooks", json={"url": receiver.url, "team": "omega"}, headers=w.as_("alpha"))
    assert r.status_code == 403
    # deleting one's own endpoint takes its log with it; the other team's is untouched
    assert w.client.delete(f"/v1/webhooks/{mine['id']}", headers=w.as_("alpha")).status_code == 200
    assert w.client.get(f"/v1/webhooks/{mine['id']}", headers=w.as_("alpha")).status_code == 404
    assert len(_deliveries(w)) == 1


def test_a_disabled_endpoint_gets_nothing_new_and_its_pending_fail(world: World, receiver: Receiver) -> None:
    w = world
    hook = w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha")).json()
    _run_job(w, "alpha-q", [("QUEUED", "ADMITTED")])  # one pending
    r = w.client.patch(f"/v1/webhooks/{hook['id']}", json={"disabled": True}, headers=w.as_("alpha"))
    assert r.status_code == 200 and r.json()["disabled"] is True and r.json()["url"] == receiver.url
    _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")])  # none made
    _deliver_due(w)
    (d,) = _deliveries(w)
    assert (d.state, d.last_error) == ("failed", "the endpoint is disabled") and receiver.got == []
    r = w.client.patch(
        f"/v1/webhooks/{hook['id']}",
        json={"disabled": False, "event_types": ["job.cancelled"]},
        headers=w.as_("alpha"),
    )
    assert r.json()["event_types"] == ["job.cancelled"] and r.json()["disabled"] is False
    _run_job(w, "alpha-q", [("QUEUED", "ADMITTED"), ("ADMITTED", "CANCELLED")])
    assert [d.event_type for d in _deliveries(w)] == ["job.admitted", "job.cancelled"]
    r = w.client.patch(f"/v1/webhooks/{hook['id']}", json={"url": "gopher://x"}, headers=w.as_("alpha"))
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "url"


def test_bad_input_is_refused_naming_the_field(sqlite_world: World) -> None:
    w = sqlite_world
    cases = [
        ({"url": "ftp://example.com/x"}, 422, "webhook.bad_url", "url"),
        ({"url": "mailto://me@example.com"}, 422, "webhook.bad_url", "url"),
        ({"url": "https://example.com/x", "event_types": ["job.done"]}, 422, "webhook.unknown_event_type", "event_types"),
    ]  # fmt: skip
    for body, status, code, field_name in cases:
        r = w.client.post("/v1/webhooks", json=body, headers=w.as_("alpha"))
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["code"] == code and err["details"]["issues"][0]["field"] == field_name
        assert err["details"]["issues"][0]["hint"]
    for i in range(3):
        r = w.client.post("/v1/webhooks", json={"url": f"https://example.com/{i}"}, headers=w.as_("alpha"))
        assert r.status_code == 201
    r = w.client.post("/v1/webhooks", json={"url": "https://example.com/4"}, headers=w.as_("alpha"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "webhook.too_many"
    assert "DELETE" in r.json()["error"]["details"]["hint"]
    assert len(w.client.get("/v1/webhooks", headers=w.as_("alpha")).json()["data"]) == 3


def test_private_addresses_are_refused_unless_allowed(tmp_path: Path, receiver: Receiver) -> None:
    w = make_world(_sqlite(tmp_path), tmp_path, allow_private=False)
    with w.client:
        w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha"))
        _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")])
        _deliver_due(w)
        (d,) = _deliveries(w)
        assert d.attempts == 1 and d.last_status_code is None
        assert "127.0.0.1" in d.last_error and "loopback" in d.last_error
        assert receiver.got == []
    w.db.dispose()


def test_notify_urls_get_every_status_change_signed_with_the_jobs_secret(
    world: World, receiver: Receiver
) -> None:
    """A job's --notify-urls (notify_urls): each http(s) URL is an endpoint of that job alone: every status change
    of the job, through the same delivery, signed with the job's own secret (GET /v1/webhooks/jobs/{id}, for the
    writers of its team), in the job's delivery log. A URL the delivery may not reach is not sent to."""
    w = world
    spec = {"notify_urls": f"{receiver.url}?a=1, ftp://nope.example.com/x ,{receiver.url}?b=2"}
    job_id = _run_job(
        w, "alpha-q", [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "FAILED")],
        failure=FailureReason.SETUP, spec=spec,
    )  # fmt: skip
    other = _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")], spec={"notify_urls": f"{receiver.url}?c=3"})
    rows = [d for d in _deliveries(w) if d.job_id == job_id]
    assert {d.endpoint_id for d in rows} == {None}
    assert sorted((d.event_type, d.url.rsplit("?", 1)[1]) for d in rows) == sorted(
        (t, q) for t in ("job.admitted", "job.starting", "job.failed") for q in ("a=1", "b=2")
    )  # the ftp URL gets nothing
    _deliver_due(w)
    assert len(receiver.got) == 7

    notify = w.client.get(f"/v1/webhooks/jobs/{job_id}", headers=w.as_("alpha"))
    assert notify.status_code == 200, notify.text
    secret = notify.json()["secret"]
    assert notify.json()["urls"] == [f"{receiver.url}?a=1", f"{receiver.url}?b=2"]
    other_secret = w.client.get(f"/v1/webhooks/jobs/{other}", headers=w.as_("alpha")).json()["secret"]
    assert secret.startswith("whsec_") and other_secret != secret  # one secret a job
    for got in receiver.got:
        ts = int(got.headers["webhook-timestamp"])
        mine = secret if got.path != "/hook?c=3" else other_secret
        assert wh.verify(mine, got.headers["webhook-id"], ts, got.body, got.headers["webhook-signature"])
        assert not wh.verify(
            other_secret if mine == secret else secret,
            got.headers["webhook-id"], ts, got.body, got.headers["webhook-signature"],
        )  # fmt: skip
    ends = [json.loads(g.body) for g in receiver.got if json.loads(g.body)["type"] == "job.failed"]
    assert len(ends) == 2 and {e["data"]["failure_reason"] for e in ends} == {"setup"}

    log = w.client.get(f"/v1/webhooks/jobs/{job_id}/deliveries?limit=4", headers=w.as_("alpha")).json()
    assert [d["event_type"] for d in log["data"]] == [
        "job.failed",
        "job.failed",
        "job.starting",
        "job.starting",
    ]
    assert {d["state"] for d in log["data"]} == {"delivered"} and log["data"][0]["url"].startswith(
        receiver.url
    )
    rest = w.client.get(
        f"/v1/webhooks/jobs/{job_id}/deliveries", params={"after": log["next_cursor"]}, headers=w.as_("alpha")
    ).json()
    assert [d["event_type"] for d in rest["data"]] == ["job.admitted"] * 2 and rest["next_cursor"] is None
    # another team's job is missing to alpha; neither its secret nor its log is shown
    omega_job = _run_job(w, "omega-q", [], spec={"notify_urls": receiver.url})
    for path in (f"/v1/webhooks/jobs/{omega_job}", f"/v1/webhooks/jobs/{omega_job}/deliveries"):
        assert w.client.get(path, headers=w.as_("alpha")).status_code == 404


def test_submission_sends_job_queued(sqlite_world: World, receiver: Receiver) -> None:
    """A submitted job's first status, QUEUED, goes to the team's endpoints and to its --notify-urls, with no
    previous status."""
    w = sqlite_world
    w.client.post(
        "/v1/webhooks", json={"url": receiver.url, "event_types": ["job.queued"]}, headers=w.as_("alpha")
    )
    with w.db.session() as s:
        seed_area(w.settings.artifacts, team_for(s, ADMIN, "alpha").id)
    r = w.client.post(
        "/v1/jobs",
        json={"name": "q", "queue": "alpha-q", "spec": grpo_spec(**{"notify-urls": receiver.url + "?job"})},
        headers=w.as_("alpha"),
    )
    assert r.status_code == 201, r.text
    rows = _deliveries(w)
    assert sorted((d.event_type, d.endpoint_id is None) for d in rows) == [
        ("job.queued", False),
        ("job.queued", True),
    ]
    _deliver_due(w)
    bodies = [json.loads(g.body) for g in receiver.got]
    assert len(bodies) == 2 and {b["data"]["id"] for b in bodies} == {r.json()["id"]}
    assert all(b["data"]["status"] == "QUEUED" and b["data"]["previous_status"] is None for b in bodies)


def test_a_real_worker_delivers_what_its_tick_finds(tmp_path: Path, receiver: Receiver) -> None:
    """The worker process: its tick sweeps what the API's transaction left (the API process hands nothing to a
    worker itself) and its task POSTs it. On SQLite only: the rest runs on both databases."""
    db_url = _sqlite(tmp_path)
    w = make_world(db_url, tmp_path)
    with w.client:
        hook = w.client.post("/v1/webhooks", json={"url": receiver.url}, headers=w.as_("alpha")).json()
        job_id = _run_job(
            w, "alpha-q", [("QUEUED", "CANCELLED")], spec={"notify_urls": receiver.url + "?job"}
        )
        env = os.environ | {
            "RELAX_HOME": str(tmp_path),
            "RELAX_DATABASE_URL": db_url,
            "RELAX_BROKER_URL": w.settings.broker_url,
            "RELAX_SCHEDULER_TICK_SECONDS": "3600",
            "RELAX_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        }
        worker = subprocess.Popen(
            worker_argv("scheduler", name=f"test-webhooks-{os.getpid()}@%h", threads=2),
            cwd=ROOT, env=env, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            make_broker_app(w.settings.broker_url, tmp_path).send_task(TASK_TICK, queue="scheduler")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(receiver.got) < 2:
                time.sleep(0.05)
            assert len(receiver.got) == 2, (tmp_path / "worker.log").read_text()[-3000:]
            with w.db.session(read_only=True) as s:
                secret = s.scalar(
                    sa.text("SELECT secret FROM webhook_endpoints WHERE id = :i"), {"i": hook["id"]}
                )
            # the endpoint's message with its secret; the --notify-urls one with the job's (the worker derives it
            # from the platform's key in RELAX_HOME, as the API does)
            job_secret = w.client.get(f"/v1/webhooks/jobs/{job_id}", headers=w.as_("alpha")).json()["secret"]
            for got in receiver.got:
                ts = int(got.headers["webhook-timestamp"])
                key = job_secret if got.path.endswith("?job") else secret
                assert wh.verify(
                    key, got.headers["webhook-id"], ts, got.body, got.headers["webhook-signature"]
                )
            while time.monotonic() < deadline and {d.state for d in _deliveries(w)} != {"delivered"}:
                time.sleep(0.05)
            assert {d.state for d in _deliveries(w)} == {"delivered"}
        finally:
            worker.terminate()
            worker.wait(30)
    w.db.dispose()


def test_relaxctl_webhooks(sqlite_world: World, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from client import cli, commands
    from client.sdk import RelaxClient

    w = sqlite_world

    def sdk(url, key):  # type: ignore[no-untyped-def]
        c = RelaxClient("http://testserver", "unused")
        c._http = w.client
        c._http.headers.update(w.as_("alpha"))
        c.close = lambda: None  # type: ignore[method-assign]
        return c

    monkeypatch.setattr(commands, "connect", sdk)
    run = CliRunner().invoke
    r = run(
        cli.app, ["webhooks", "create", receiver.url, "--event", "job.cancelled", "--event", "job.failed"]
    )
    assert r.exit_code == 0, r.output
    hook_id, secret = r.output.split()[0], r.output.split("secret: ")[1].split()[0]
    assert hook_id.startswith("wh_") and secret.startswith("whsec_")
    r = run(cli.app, ["webhooks", "create", "mailto://me@example.com"])
    assert r.exit_code == 2 and "webhook.bad_url" in r.output and "hint" in r.output
    r = run(cli.app, ["webhooks", "list", "--json"])
    assert [h["id"] for h in json.loads(r.output)] == [hook_id]
    job_id = _run_job(w, "alpha-q", [("QUEUED", "CANCELLED")], spec={"notify_urls": receiver.url + "?job"})
    _deliver_due(w)
    r = run(cli.app, ["webhooks", "deliveries", hook_id, "--wide"])
    assert r.exit_code == 0 and "job.cancelled" in r.output and "delivered" in r.output, r.output
    r = run(cli.app, ["webhooks", "job", job_id])
    assert r.exit_code == 0 and receiver.url + "?job" in r.output and "secret: whsec_" in r.output, r.output
    r = run(cli.app, ["webhooks", "job-deliveries", job_id, "--json"])
    assert [(d["event_type"], d["url"], d["state"]) for d in json.loads(r.output)] == [
        ("job.cancelled", receiver.url + "?job", "delivered")
    ]
    (d,) = [d for d in _deliveries(w) if d.endpoint_id == hook_id]
    r = run(cli.app, ["webhooks", "retry", hook_id, d.id])
    assert r.exit_code == 0 and "attempt 2" in r.output, r.output
    r = run(cli.app, ["webhooks", "disable", hook_id])
    assert r.exit_code == 0 and "disabled" in r.output
    assert json.loads(run(cli.app, ["webhooks", "list", "--json"]).output)[0]["disabled"] is True
    r = run(cli.app, ["webhooks", "enable", hook_id])
    assert (
        r.exit_code == 0
        and json.loads(run(cli.app, ["webhooks", "list", "--json"]).output)[0]["disabled"] is False
    )
    r = run(cli.app, ["webhooks", "delete", hook_id])
    assert r.exit_code == 0 and hook_id in r.output
    assert json.loads(run(cli.app, ["webhooks", "list", "--json"]).output) == []
