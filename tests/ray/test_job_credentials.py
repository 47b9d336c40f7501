"""A job's credentials on a real Ray head (started as the embedded platform starts it) against the real
API: what Ray's Jobs API returns about a launched job (entrypoint, environment, metadata) opens nothing,
the driver gets its token by the one-time exchange and reports with it, and neither the token nor the
bootstrap secret shows in the job's logs. Also the assumption the design rests on for Ray actors: Ray's
dashboard APIs do not show an actor's constructor arguments."""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from api.app import create_app
from api.embedded import Children, free_port, start_ray
from runtime.launcher import RayJobLauncher
from scheduler import tasks
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.db.models import Job, JobEvent
from scheduler.services.job_tokens import bootstrap_secret, job_token
from scheduler.services.lifecycle import JobLifecycle
from scheduler.settings import ApiSettings, DatabaseSettings, Settings
from tests.factories import bootstrap, make_job


class _NoDispatch:
    """No worker here: the test moves the job itself."""

    def request_pass(self) -> None: ...
    def launch(self, job_id: str, pool: str) -> None: ...
    def stop(self, job_id: str, pool: str) -> None: ...
    def reconcile(self, pool: str) -> None: ...


def _ray_headers(settings: Settings) -> dict[str, str]:
    """The Ray token of pool `local`, where its Ray runs with token auth."""
    token = settings.ray_token("local")
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Ray head, and the API (real uvicorn, SQLite) on a free port that the Ray job's driver calls."""
    home = tmp_path_factory.mktemp("credhome")
    port = free_port()
    settings = Settings(
        home=home,
        database=DatabaseSettings(url=f"sqlite:///{home / 'relax.db'}"),
        api=ApiSettings(host="127.0.0.1", port=port),
    )
    upgrade(settings.database_url)
    children = Children(home / "logs")
    db = Database(settings.database_url)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, db=db, dispatcher=_NoDispatch()),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        address = start_ray(children, settings)
        bootstrap(db, home, ray_address=address)
        thread.start()
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.1)
        yield {"settings": settings, "db": db, "address": address, "url": settings.public_url}
    finally:
        server.should_exit = True
        thread.join(10)
        children.stop()
        db.dispose()


def _dashboard_get(address: str, path: str, headers: dict[str, str]) -> str:
    """As a script (not a browser) reads the dashboard: Ray 2.60 masks runtime_env values for browsers only."""
    req = urllib.request.Request(f"{address}{path}", headers={"User-Agent": "curl/8", **headers})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):  # every value, and every word of it (an entrypoint, a log message)
        yield from (word.strip("'\",;:()[]{}") for word in value.split())
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_ray_jobs_api_shows_no_usable_credential(world: dict[str, Any]) -> None:
    settings, db = world["settings"], world["db"]
    job_id = make_job(
        db, artifact_root=settings.artifacts
    )  # an empty spec: the driver stops after fetching it
    with db.session() as s:
        JobLifecycle(s).transition(job_id, "ADMITTED", expected_from="QUEUED", reason="test")
    ctx = tasks.WorkerContext(settings=settings, app=None)  # type: ignore[arg-type]
    ctx.__dict__["db"] = db
    tasks.launch_job(ctx, job_id)

    # The driver exchanges its bootstrap secret first thing, then fetches the spec and reports.
    deadline = time.time() + 120
    while time.time() < deadline:
        with db.session(read_only=True) as s:
            job = s.get(Job, job_id)
            claimed, sub_id = job.token_claimed_attempt, job.ray_submission_id
            kinds = {e.kind for e in s.query(JobEvent).filter(JobEvent.job_id == job_id)}
        if claimed == 1 and "failed" in kinds:
            break
        time.sleep(0.5)
    assert claimed == 1 and "failed" in kinds, (claimed, kinds)  # its report, sent with the token, landed

    headers = _ray_headers(settings)
    launcher = RayJobLauncher(world["address"], settings.ray_token("local"))
    deadline = time.time() + 60
    while (
        time.time() < deadline
        and (info := launcher.status(sub_id))
        and info.status not in ("SUCCEEDED", "FAILED")
    ):
        time.sleep(0.5)
    # Everything the Jobs API returns about the job, as its REST endpoints answer a script.
    listing = json.loads(_dashboard_get(world["address"], "/api/jobs/", headers))
    mine = [j for j in listing if j.get("submission_id") == sub_id]
    assert mine and mine[0]["runtime_env"]["env_vars"]["RELAX_JOB_BOOTSTRAP"].startswith("rjb_1_")
    detail = json.loads(_dashboard_get(world["address"], f"/api/jobs/{sub_id}", headers))
    logs = json.loads(_dashboard_get(world["address"], f"/api/jobs/{sub_id}/logs", headers))["logs"]

    token = job_token(settings.signing_key(), job_id, 1)
    bootstrap = bootstrap_secret(settings.signing_key(), job_id, 1)
    exposed = json.dumps([mine, detail])
    assert token not in exposed and token not in logs
    assert bootstrap not in logs  # the driver never prints it
    assert "runtime.bootstrap" in detail["entrypoint"]

    # No string the Jobs API shows opens the job's internal routes (the bootstrap secret is spent).
    url = world["url"]
    for candidate in {c for c in _strings([mine, detail]) if c.isprintable() and len(c) >= 8}:
        auth = {"Authorization": f"Bearer {candidate}"}
        assert httpx.get(f"{url}/v1/internal/jobs/{job_id}/spec", headers=auth).status_code == 401
        report = httpx.post(
            f"{url}/v1/internal/jobs/{job_id}/report", json={"attempt": 1, "seq": 99}, headers=auth
        )
        assert report.status_code == 401
        assert httpx.post(f"{url}/v1/internal/jobs/{job_id}/token", headers=auth).status_code in (401, 409)
    # ... while the attempt is live: the platform's own token for it still works (no reconciler runs here)
    ok = httpx.get(f"{url}/v1/internal/jobs/{job_id}/spec", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200


_ACTOR_SCRIPT = """
import pathlib, secrets, sys, time
import ray

ray.init()
secret = "actorarg-" + secrets.token_hex(16)
pathlib.Path(sys.argv[1]).write_text(secret)

@ray.remote(num_cpus=0)
class Holder:
    def __init__(self, credential):
        self._credential = credential

    def ping(self):
        return len(self._credential)

holder = Holder.options(name="holder").remote(secret)
assert ray.get(holder.ping.remote()) > 0
print("ready", flush=True)
time.sleep(120)
"""


def test_ray_dashboard_does_not_show_actor_constructor_arguments(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """The way a per-attempt credential may reach a Ray actor (engine servers): as a constructor argument
    in-process, which none of the dashboard's actor, task or job endpoints returns."""
    script, secret_file = tmp_path / "actor.py", tmp_path / "secret.txt"
    script.write_text(_ACTOR_SCRIPT)
    launcher = RayJobLauncher(world["address"], world["settings"].ray_token("local"))
    sub_id = f"actor-args-{secrets.token_hex(3)}"
    launcher.submit(sub_id, f"{sys.executable} {script} {secret_file}", env={}, metadata={})
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not any("ready" in ln for ln in launcher.logs_tail(sub_id)):
            time.sleep(0.5)
        secret = secret_file.read_text()
        headers = _ray_headers(world["settings"])
        for path, lists_actor in (
            ("/api/v0/actors?detail=1&limit=1000", True),
            ("/api/v0/tasks?detail=1&limit=1000", False),  # task events may lag; never the argument
            ("/logical/actors", True),
            ("/api/jobs/", False),
            (f"/api/jobs/{sub_id}/logs", False),
        ):
            body = _dashboard_get(world["address"], path, headers)
            assert "Holder" in body or not lists_actor, path  # the actor is listed...
            assert secret not in body, path  # ... but not its argument
    finally:
        launcher.stop(sub_id)
