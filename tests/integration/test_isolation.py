"""Isolation between teams, generated from the OpenAPI document: every route x every credential x own
team's / other team's object, each answer checked against one expectation table, and no answer to a
team's key naming anything of the other team (0 leaks). A route missing from the table fails the test:
a new route must be classified here (docs/security.md explains the classes).

Two teams, `alpha-team` (the callers' own) and `omega-team` (the other), each with a queue, a running
job holding a GPU, a finished job with logs, metrics, a checkpoint and an output file, a key to revoke
and a path grant. Credentials: an admin key, alpha's team_admin, member and viewer keys, no key, an
expired and a revoked alpha key, and the driver credentials of alpha's running job (its token and its
bootstrap secret)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, AuditEvent, Checkpoint, Job, Metric, WebhookDelivery, utcnow
from scheduler.dispatch import CeleryDispatcher
from scheduler.domain import webhooks as wh
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import JobStatus
from scheduler.services import platform, webhooks
from scheduler.services.auth import Principal, create_api_key
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, grpo_spec, make_broker_app, make_job

ADMIN = Principal(key_id="key_fixture", role="admin", team_id=None)
TEAMS = {"own": "alpha-team", "other": "omega-team"}
KEY_ROLES = ("admin", "team_admin", "member", "viewer")
REFUSED_KEYS = {"none": "unauthenticated", "expired": "auth.key_expired", "revoked": "auth.key_revoked"}
DRIVER_CREDENTIALS = ("job_token", "bootstrap")
CREDENTIALS = (*REFUSED_KEYS, *DRIVER_CREDENTIALS, "viewer", "member", "team_admin", "admin")
TARGETS = ("own", "other")


# The world ---------------------------------------------------------------------------------------
@dataclass
class Side:
    """One team's objects."""

    team_id: str
    team: str
    queue: str
    live_job: str
    done_job: str
    victim_key: str  # a key of the team that the matrix revokes
    grant_id: str | None = None
    webhook_id: str | None = None
    delivery_id: str | None = None
    file_id: str | None = None
    upload_id: str | None = None
    eval_id: str | None = None
    ft_file_id: str | None = None  # a file of purpose fine-tune (chat rows)
    ft_job_id: str | None = None  # a fine-tuning job (/v1/fine_tuning/jobs)
    secrets: set[str] = field(default_factory=set)  # every string that names one of its objects


@dataclass
class World:
    client: TestClient
    db: Database
    settings: Settings
    home: Path
    sides: dict[str, Side]
    headers: dict[str, dict[str, str]]
    counter: itertools.count = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.counter)}"


def _side(db: Database, settings: Settings, tag: str, name: str) -> Side:
    with db.session() as s:
        team = platform.create_team(s, ADMIN, name)
        platform.create_queue(
            s,
            ADMIN,
            name=f"{tag}-queue",
            pool="local",
            team=name,
            nominal_gpus=1,
            borrowing_limit=None,
            lending_limit=None,
            weight=1.0,
        )
        victim, _ = create_api_key(s, name=f"{tag}-victim-key", role="member", team_id=team.id)
        team_id, victim_id, victim_prefix = team.id, victim.id, victim.prefix
    art = settings.artifacts
    live = make_job(db, queue=f"{tag}-queue", name=f"{tag}-live-job", artifact_root=art)
    done = make_job(db, queue=f"{tag}-queue", name=f"{tag}-done-job", artifact_root=art)
    with db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in (("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING")):
            assert svc.transition(live, JobStatus(dst), expected_from=JobStatus(src), reason="fixture")
        s.get(Job, live).token_claimed_attempt = 1
        s.add(Allocation(job_id=live, pool="local", node="node-0", role="actor", gpus=1))
        assert svc.transition(done, JobStatus.CANCELLED, expected_from=JobStatus.QUEUED, reason="fixture")
        job = s.get(Job, done)
        JobReports(s).add_logs(job, [{"message": f"{tag}-log-line"}], source="driver")
        s.add(Metric(job_id=done, attempt=0, step=1, name=f"{tag}/metric", value=1.0, time=utcnow()))
        s.add(
            Checkpoint(
                job_id=done,
                attempt=0,
                step=1,
                path=f"/ckpt/{tag}-checkpoint",
                size_bytes=1,
                format="torch",
                time=utcnow(),
            )
        )
        out_dir = Path(job.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "out.txt").write_text(f"{tag}-file-content\n")
    area = art / "teams" / team_id  # what artifacts:// names for the team (scheduler/services/paths.py)
    (area / "models" / "tiny").mkdir(parents=True)
    (area / "data").mkdir()
    (area / "data" / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    secrets = {
        team_id, name, f"{tag}-queue", live, done, f"{tag}-live-job", f"{tag}-done-job", victim_id,
        f"{tag}-victim-key", victim_prefix, f"{tag}-log-line", f"{tag}/metric", f"{tag}-checkpoint",
        f"{tag}-file-content",
    }  # fmt: skip
    return Side(team_id, name, f"{tag}-queue", live, done, victim_id, secrets=secrets)


@pytest.fixture
def world(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    home = tmp_path / "home"  # path grants must lie outside it
    settings = Settings(
        home=home,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    db = Database(db_url)
    admin_key = bootstrap(db, home)
    sides = {
        "own": _side(db, settings, "alpha", TEAMS["own"]),
        "other": _side(db, settings, "omega", TEAMS["other"]),
    }
    own = sides["own"].team_id
    raw: dict[str, str] = {"admin": admin_key}
    with db.session() as s:
        for role in ("team_admin", "member", "viewer"):
            key, raw[role] = create_api_key(s, name=f"alpha-{role}", role=role, team_id=own)
        _, raw["expired"] = create_api_key(
            s, name="alpha-expired", role="member", team_id=own, expires_at=utcnow() - timedelta(days=1)
        )
        revoked, raw["revoked"] = create_api_key(s, name="alpha-revoked", role="member", team_id=own)
        revoked.revoked_at = utcnow()
    from scheduler.services.job_tokens import bootstrap_secret, job_token

    raw["job_token"] = job_token(settings.signing_key(), sides["own"].live_job, 1)
    raw["bootstrap"] = bootstrap_secret(settings.signing_key(), sides["own"].live_job, 1)
    headers = {name: {"Authorization": f"Bearer {value}"} for name, value in raw.items()}
    headers["none"] = {}
    broker = make_broker_app(settings.broker_url, home)
    app = create_app(settings, db=db, dispatcher=CeleryDispatcher(broker))
    with TestClient(app) as client:
        w = World(client, db, settings, tmp_path, sides, headers)  # grants go under tmp_path
        for tag, side in sides.items():
            granted = tmp_path / f"granted-{tag}"
            granted.mkdir()
            r = client.post(
                "/v1/admin/path-grants",
                json={"team": side.team, "path": str(granted), "mode": "ro"},
                headers=headers["admin"],
            )
            assert r.status_code == 201, r.text
            side.grant_id = r.json()["id"]
            side.secrets |= {side.grant_id, str(granted)}
            hook_url = f"https://hooks.example.com/{tag}-hook"
            r = client.post(
                "/v1/webhooks", json={"team": side.team, "url": hook_url}, headers=headers["admin"]
            )
            assert r.status_code == 201, r.text
            side.webhook_id = r.json()["id"]
            side.delivery_id = _delivered_message(db, side)
            side.secrets |= {side.webhook_id, hook_url, side.delivery_id, r.json()["secret"]}
            side.secrets |= {
                wh.job_secret(settings.signing_key(), job) for job in (side.done_job, side.live_job)
            }  # the secrets of its jobs' --notify-urls
            r = client.post(
                "/v1/files",
                files={"file": (f"{tag}-upload.jsonl", b"{}\n", "application/jsonl")},
                data={"purpose": "dataset", "team": side.team},
                headers=headers["admin"],
            )
            assert r.status_code == 200, r.text
            side.file_id = r.json()["id"]
            r = client.post(
                "/v1/uploads",
                json={"filename": "m.bin", "purpose": "model", "bytes": 10, "mime_type": "application/octet-stream",
                      "team": side.team},
                headers=headers["admin"],
            )  # fmt: skip
            assert r.status_code == 200, r.text
            side.upload_id = r.json()["id"]
            side.secrets |= {side.file_id, side.upload_id, f"{tag}-upload.jsonl"}
            r = client.post(
                "/v1/evals", json=_eval_body(w, tag) | {"name": f"{tag}-eval"}, headers=headers["admin"]
            )
            assert r.status_code == 201, r.text
            side.eval_id = r.json()["id"]
            side.secrets |= {side.eval_id, f"{tag}-eval", r.json()["job_id"]}
            r = client.post(
                "/v1/files",
                files={"file": (f"{tag}-chat.jsonl", _CHAT_ROW, "application/jsonl")},
                data={"purpose": "fine-tune", "team": side.team},
                headers=headers["admin"],
            )
            assert r.status_code == 200, r.text
            side.ft_file_id = r.json()["id"]
            r = client.post("/v1/fine_tuning/jobs", json=_ft_body(w, tag), headers=headers["admin"])
            assert r.status_code == 200, r.text
            side.ft_job_id = r.json()["id"]
            side.secrets |= {side.ft_file_id, side.ft_job_id, f"{tag}-chat.jsonl"}
        yield w
    db.dispose()


def _delivered_message(db: Database, side: Side) -> str:
    """A delivered message of the side's webhook (one the matrix may retry)."""
    msg_id = new_id("msg")
    with db.session() as s:
        job = s.get(Job, side.done_job)
        payload = webhooks.job_payload(job, "job.cancelled", utcnow(), JobStatus.QUEUED)
        s.add(
            WebhookDelivery(
                id=msg_id, endpoint_id=side.webhook_id, team_id=side.team_id, job_id=side.done_job,
                url="https://hooks.example.com/", event_type="job.cancelled", payload=payload,
                state="delivered", attempts=1, finished_at=utcnow(),
            )
        )  # fmt: skip
    return msg_id


def _fresh_webhook(w: World, side: Side) -> str:
    """A webhook of the side made for one DELETE cell (each allowed DELETE removes one)."""
    with w.db.session() as s:
        return webhooks.create_endpoint(
            s, ADMIN, url="https://hooks.example.com/x", event_types=None, description=None, team=side.team,
            max_per_team=1000,
        ).id  # fmt: skip


def _fresh_file(w: World, side: Side) -> str:
    """A file of the side made for one DELETE cell (each allowed DELETE removes one)."""
    import io

    from scheduler.services.files import Files
    from scheduler.services.filestore import store_for

    root = w.settings.artifacts
    with w.db.session() as s:
        svc = Files(s, settings=w.settings.files, artifact_root=root, store=store_for(w.settings.files, root))
        return svc.create(
            ADMIN,
            io.BytesIO(b"{}\n"),
            filename="x.jsonl",
            purpose="dataset",
            content_type=None,
            team=side.team,
        ).id


# The expectation table ---------------------------------------------------------------------------
PUBLIC = "public"  # no credential needed
GLOBAL = "global"  # names no team's object: the role decides
TEAM_PATH = "team_path"  # the path names a team's object: another team's is answered 404
TEAM_BODY = "team_body"  # the body names a team: a team key naming another is answered 403
DRIVER = "driver"  # /v1/internal: only the token of the job in the path
DRIVER_BOOTSTRAP = "driver_bootstrap"  # /v1/internal token exchange: only the job's bootstrap secret

ALL = frozenset(KEY_ROLES)
WRITERS = frozenset({"admin", "team_admin", "member"})
KEY_ADMINS = frozenset({"admin", "team_admin"})
ADMINS = frozenset({"admin"})
OK = frozenset({200})

Body = Callable[[World, str], Any]


@dataclass(frozen=True)
class Rule:
    kind: str
    roles: frozenset[str] = frozenset()
    ok: frozenset[int] = OK  # answers that mean "allowed" (a valid request may still be judged on its merits)
    body: Body | None = None
    live_job: bool = False  # fill {job_id} with the running job (the finished one otherwise)


def _spec() -> dict:
    """A valid spec whose paths lie in the submitting team's own area."""
    return grpo_spec(
        **{"hf-checkpoint": "artifacts://models/tiny", "prompt-data": "artifacts://data/train.jsonl"}
    )


def _eval_body(w: World, t: str) -> dict:
    return {
        "model": {"path": "artifacts://models/tiny"},
        "eval_prompt_data": ["arith", "artifacts://data/train.jsonl"],
        "thresholds": ["eval/arith >= 0.5"],
        "spec": {"input-key": "prompt", "label-key": "label", "rm-type": "math"},
        "team": w.sides[t].team,
        "queue": w.sides[t].queue,
        "name": w.unique("iso-eval"),
    }


_CHAT_ROW = b'{"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}\n'


def _ft_body(w: World, t: str) -> dict:
    side = w.sides[t]
    return {"model": "artifacts://models/tiny", "training_file": side.ft_file_id, "team": side.team}


def _job_body(w: World, t: str) -> dict:
    return {
        "spec": _spec(),
        "team": w.sides[t].team,
        "queue": w.sides[t].queue,
        "name": w.unique("iso-job"),
    }


ROUTES: dict[tuple[str, str], Rule] = {
    ("GET", "/healthz"): Rule(PUBLIC),
    ("GET", "/readyz"): Rule(PUBLIC),
    ("GET", "/metrics"): Rule(GLOBAL, ADMINS),
    # jobs
    ("POST", "/v1/jobs"): Rule(TEAM_BODY, WRITERS, frozenset({201}), _job_body),
    ("GET", "/v1/jobs"): Rule(GLOBAL, ALL),
    ("GET", "/v1/jobs/{job_id}"): Rule(TEAM_PATH, ALL),
    ("POST", "/v1/jobs/{job_id}/cancel"): Rule(TEAM_PATH, WRITERS, frozenset({202, 409}), live_job=True),
    ("GET", "/v1/jobs/{job_id}/events"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/metrics"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/logs"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/checkpoints"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/rollouts"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/predictions"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/artifacts/{path}"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/jobs/{job_id}/stream"): Rule(TEAM_PATH, ALL),
    ("POST", "/v1/specs/validate"): Rule(
        TEAM_BODY,
        ALL,
        body=lambda w, t: {"spec": _spec(), "team": w.sides[t].team, "queue": w.sides[t].queue},
    ),
    # platform: read by every role, each sees its share
    ("GET", "/v1/pools"): Rule(GLOBAL, ALL),
    ("GET", "/v1/queues"): Rule(GLOBAL, ALL),
    ("GET", "/v1/teams"): Rule(GLOBAL, ALL),
    ("GET", "/v1/teams/{team}"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/priority-classes"): Rule(GLOBAL, ALL),
    ("GET", "/v1/api-keys"): Rule(GLOBAL, ALL),
    ("POST", "/v1/api-keys"): Rule(
        TEAM_BODY,
        KEY_ADMINS,
        frozenset({201}),
        lambda w, t: {
            "name": w.unique("iso-key"),
            "role": "member",
            "team": w.sides[t].team,
            "expires_in_days": 1,
        },
    ),
    ("DELETE", "/v1/api-keys/{key_id}"): Rule(TEAM_PATH, KEY_ADMINS),
    # platform: admin only
    ("POST", "/v1/teams"): Rule(
        GLOBAL, ADMINS, frozenset({201}), lambda w, t: {"name": w.unique("iso-team")}
    ),
    ("PATCH", "/v1/teams/{team}"): Rule(TEAM_PATH, ADMINS, body=lambda w, t: {"allowed_queues": None}),
    ("POST", "/v1/pools"): Rule(
        GLOBAL, ADMINS, frozenset({201}), lambda w, t: {"name": w.unique("iso-pool"), "accelerator": "cpu"}
    ),
    ("PATCH", "/v1/pools/{name}"): Rule(GLOBAL, ADMINS, body=lambda w, t: {"cordoned": False}),
    ("PUT", "/v1/pools/{name}/nodes/{node}"): Rule(
        GLOBAL, ADMINS, body=lambda w, t: {"name": "node-0", "gpus": 2, "labels": {}}
    ),
    ("PATCH", "/v1/pools/{name}/nodes/{node}"): Rule(GLOBAL, ADMINS, body=lambda w, t: {"cordoned": False}),
    ("POST", "/v1/pools/{name}/nodes/{node}/drain"): Rule(GLOBAL, ADMINS),
    ("POST", "/v1/queues"): Rule(
        TEAM_BODY,
        ADMINS,
        frozenset({201}),
        lambda w, t: {
            "name": w.unique("iso-queue"),
            "pool": "local",
            "team": w.sides[t].team,
            "nominal_gpus": 0,
        },
    ),
    ("PATCH", "/v1/queues/{name}"): Rule(TEAM_PATH, ADMINS, body=lambda w, t: {"weight": 1.0}),
    ("POST", "/v1/priority-classes"): Rule(
        GLOBAL, ADMINS, frozenset({201}), lambda w, t: {"name": w.unique("iso-class"), "value": 1}
    ),
    ("GET", "/v1/admin/audit"): Rule(GLOBAL, ADMINS),
    # path grants (admin) and the team's storage view
    ("GET", "/v1/admin/path-grants"): Rule(GLOBAL, ADMINS),
    ("POST", "/v1/admin/path-grants"): Rule(
        TEAM_BODY,
        ADMINS,
        frozenset({201, 409}),
        lambda w, t: {"team": w.sides[t].team, "path": str(w.home / "granted-extra"), "mode": "ro"},
    ),
    ("DELETE", "/v1/admin/path-grants/{grant_id}"): Rule(TEAM_PATH, ADMINS),
    ("GET", "/v1/storage"): Rule(GLOBAL, ALL),
    # webhooks: the team's writers (a URL may carry the receiver's token)
    ("GET", "/v1/webhooks"): Rule(GLOBAL, WRITERS),
    ("POST", "/v1/webhooks"): Rule(
        TEAM_BODY,
        WRITERS,
        frozenset({201}),
        lambda w, t: {"team": w.sides[t].team, "url": "https://hooks.example.com/new"},
    ),
    ("GET", "/v1/webhooks/{webhook_id}"): Rule(TEAM_PATH, WRITERS),
    ("DELETE", "/v1/webhooks/{webhook_id}"): Rule(TEAM_PATH, WRITERS),
    ("PATCH", "/v1/webhooks/{webhook_id}"): Rule(TEAM_PATH, WRITERS, body=lambda w, t: {"disabled": False}),
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): Rule(TEAM_PATH, WRITERS),
    # a job's --notify-urls: its secret and its delivery log, for the writers of its team
    ("GET", "/v1/webhooks/jobs/{job_id}"): Rule(TEAM_PATH, WRITERS),
    ("GET", "/v1/webhooks/jobs/{job_id}/deliveries"): Rule(TEAM_PATH, WRITERS),
    ("POST", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/retry"): Rule(
        TEAM_PATH, WRITERS, frozenset({202, 409})
    ),
    # files (OpenAI's Files and Uploads shapes): every role reads the team's, its writers upload and delete. The
    # matrix sends JSON: a route that takes multipart answers 415 once the key and the object are judged.
    ("POST", "/v1/files"): Rule(GLOBAL, WRITERS, frozenset({415})),
    ("GET", "/v1/files"): Rule(GLOBAL, ALL),
    ("GET", "/v1/files/{file_id}"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/files/{file_id}/content"): Rule(TEAM_PATH, ALL),
    ("DELETE", "/v1/files/{file_id}"): Rule(TEAM_PATH, WRITERS),
    ("POST", "/v1/uploads"): Rule(
        TEAM_BODY,
        WRITERS,
        body=lambda w, t: {
            "team": w.sides[t].team,
            "filename": "m.bin",
            "purpose": "model",
            "bytes": 10,
            "mime_type": "application/octet-stream",
        },
    ),  # fmt: skip
    ("GET", "/v1/uploads/{upload_id}"): Rule(TEAM_PATH, ALL),
    ("POST", "/v1/uploads/{upload_id}/parts"): Rule(TEAM_PATH, WRITERS, frozenset({415})),
    ("POST", "/v1/uploads/{upload_id}/complete"): Rule(
        TEAM_PATH, WRITERS, frozenset({409, 422}), body=lambda w, t: {"part_ids": ["part_none"]}
    ),
    ("POST", "/v1/uploads/{upload_id}/cancel"): Rule(TEAM_PATH, WRITERS, frozenset({200, 409})),
    # evals: run by the team's writers, read by every role of the team
    ("POST", "/v1/evals"): Rule(TEAM_BODY, WRITERS, frozenset({201}), _eval_body),
    ("GET", "/v1/evals"): Rule(GLOBAL, ALL),
    ("GET", "/v1/evals/{eval_id}"): Rule(TEAM_PATH, ALL),
    # OpenAI's fine-tuning jobs (each one of the team's jobs): as jobs, created by the writers, read by every role
    ("POST", "/v1/fine_tuning/jobs"): Rule(TEAM_BODY, WRITERS, body=_ft_body),
    ("GET", "/v1/fine_tuning/jobs"): Rule(GLOBAL, ALL),
    ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}"): Rule(TEAM_PATH, ALL),
    ("POST", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/cancel"): Rule(
        TEAM_PATH, WRITERS, frozenset({200, 409})
    ),
    ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/events"): Rule(TEAM_PATH, ALL),
    ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/checkpoints"): Rule(TEAM_PATH, ALL),
    # dashboard sign-in: a login code for one's own key; its exchange needs the code, not a key
    ("POST", "/v1/auth/login-codes"): Rule(GLOBAL, ALL, frozenset({201})),
    ("POST", "/v1/auth/sessions"): Rule(PUBLIC, ok=frozenset({401}), body=lambda w, t: {"code": "wrong"}),
    # drivers
    ("POST", "/v1/internal/jobs/{job_id}/token"): Rule(
        DRIVER_BOOTSTRAP, ok=frozenset({200, 409}), live_job=True
    ),
    ("GET", "/v1/internal/jobs/{job_id}/spec"): Rule(DRIVER, live_job=True),
    ("POST", "/v1/internal/jobs/{job_id}/report"): Rule(
        DRIVER, body=lambda w, t: {"attempt": 1, "seq": 0}, live_job=True
    ),
}


def expected(rule: Rule, credential: str, target: str) -> frozenset[int]:
    """The answers allowed for one cell."""
    if rule.kind == PUBLIC:
        return rule.ok
    if rule.kind in (DRIVER, DRIVER_BOOTSTRAP):
        wanted = "job_token" if rule.kind == DRIVER else "bootstrap"
        return rule.ok if (credential == wanted and target == "own") else frozenset({401})
    if credential in REFUSED_KEYS or credential in DRIVER_CREDENTIALS:
        return frozenset({401})
    if credential not in rule.roles:
        return frozenset({403})
    if target == "other" and credential != "admin":
        return (
            frozenset({404})
            if rule.kind == TEAM_PATH
            else frozenset({403})
            if rule.kind == TEAM_BODY
            else rule.ok
        )
    return rule.ok


def fill(w: World, method: str, template: str, rule: Rule, target: str) -> str:
    side = w.sides[target]
    values = {
        "job_id": side.live_job if rule.live_job else side.done_job,
        "key_id": side.victim_key,
        "team": side.team,
        "grant_id": side.grant_id,
        "webhook_id": _fresh_webhook(w, side)
        if method == "DELETE" and "{webhook_id}" in template
        else side.webhook_id,
        "delivery_id": side.delivery_id,
        "file_id": _fresh_file(w, side) if method == "DELETE" and "{file_id}" in template else side.file_id,
        "upload_id": side.upload_id,
        "eval_id": side.eval_id,
        "fine_tuning_job_id": side.ft_job_id,
        "node": "node-0",
        "path": "out.txt",
        "name": side.queue if template.startswith("/v1/queues") else "local",
    }
    path = template
    for name, value in values.items():
        path = path.replace("{" + name + "}", str(value))
    assert "{" not in path, f"no value for a parameter of {method} {template}: add one to fill()"
    return path


# The matrix --------------------------------------------------------------------------------------
def _operations(client: TestClient) -> list[tuple[str, str]]:
    return [
        (method.upper(), path)
        for path, item in client.app.openapi()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


def test_every_route_every_credential_own_and_other_team(world: World) -> None:
    w = world
    operations = _operations(w.client)
    assert not (missing := sorted(set(operations) - set(ROUTES))), (
        f"classify these routes in ROUTES: {missing}"
    )
    assert not (stale := sorted(set(ROUTES) - set(operations))), f"routes no longer in the API: {stale}"
    with w.db.session(read_only=True) as s:
        audit_before = s.scalar(sa.select(sa.func.count()).select_from(AuditEvent))

    mismatches, leaks, audited, cells = [], [], 0, 0
    started = time.monotonic()
    for method, template in sorted(operations):
        rule = ROUTES[(method, template)]
        for credential, target in itertools.product(CREDENTIALS, TARGETS):
            cells += 1
            path = fill(w, method, template, rule, target)
            body = rule.body(w, target) if rule.body else None
            r = w.client.request(method, path, json=body, headers=w.headers[credential])
            want = expected(rule, credential, target)
            if r.status_code not in want:
                mismatches.append(
                    f"{credential:>10} {target:>5} {method} {path}: {r.status_code} not in {set(want)}: {r.text[:200]}"
                )
            if (
                r.status_code == 401
                and credential in REFUSED_KEYS
                and rule.kind not in (DRIVER, DRIVER_BOOTSTRAP, PUBLIC)
            ):
                code = r.json()["error"]["code"]
                if code != REFUSED_KEYS[credential]:
                    mismatches.append(f"{credential} {method} {path}: code {code}")
            if credential != "admin":
                sent = path + json.dumps(body or {})
                named = {s for s in w.sides["other"].secrets if s in r.text and s not in sent}
                if named:
                    leaks.append(
                        f"{credential} {target} {method} {path} ({r.status_code}) names {sorted(named)}"
                    )
            if method != "GET" and not template.startswith("/v1/internal/"):
                audited += 1
    elapsed = time.monotonic() - started
    print(
        f"\nisolation matrix: {len(operations)} routes x {len(CREDENTIALS)} credentials x 2 teams = {cells} cells in {elapsed:.1f} s"
    )
    assert not mismatches, f"{len(mismatches)} cells differ from the table:\n" + "\n".join(mismatches)
    assert not leaks, f"{len(leaks)} answers name the other team's objects:\n" + "\n".join(leaks)
    # every mutating call (refused ones too) left one audit row; the drivers' calls none, but for the
    # anomaly of a reused bootstrap secret, which admins must see
    with w.db.session(read_only=True) as s:
        new = s.scalars(sa.select(AuditEvent).order_by(AuditEvent.id).offset(audit_before)).all()
    internal = [e for e in new if e.path.startswith("/v1/internal/")]
    assert len(new) - len(internal) == audited
    assert {(e.path, e.details.get("error")) for e in internal} <= {
        ("/v1/internal/jobs/{job_id}/token", "job.bootstrap_reused")
    }
