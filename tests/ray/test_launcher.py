"""RayJobLauncher against a real local Ray head started the way the embedded platform starts it."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

import pytest
from ray.exceptions import AuthenticationError

from api.embedded import Children, start_ray
from runtime.launcher import RAY_STOPPED, RAY_SUCCEEDED, RayJobLauncher
from scheduler.settings import Settings


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(Jobs API address, the pool's Ray token)."""
    home = tmp_path_factory.mktemp("rayhome")
    children = Children(home / "logs")
    settings = Settings(home=home)
    try:
        address = start_ray(children, settings)
        yield address, settings.ray_token("local")
    finally:
        children.stop()


def _wait(launcher: RayJobLauncher, sub_id: str, statuses: set[str], timeout: float = 60) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = launcher.status(sub_id)
        if info and info.status in statuses:
            return info.status
        time.sleep(0.3)
    raise AssertionError(f"{sub_id} never reached {statuses}: {launcher.status(sub_id)}")


def test_submit_is_idempotent_and_logs_are_readable(ray_head: tuple[str, str]) -> None:
    launcher = RayJobLauncher(*ray_head)
    cmd = f"{sys.executable} -c \"import os; print('hello from', os.environ['RELAX_JOB_ID'])\""
    assert launcher.submit("job_t1-a1", cmd, env={"RELAX_JOB_ID": "job_t1"}, metadata={}) is True
    assert launcher.submit("job_t1-a1", cmd, env={"RELAX_JOB_ID": "job_t1"}, metadata={}) is False
    assert _wait(launcher, "job_t1-a1", {RAY_SUCCEEDED, "FAILED"}) == RAY_SUCCEEDED
    assert any("hello from job_t1" in line for line in launcher.logs_tail("job_t1-a1"))
    assert launcher.status("job_never-a1") is None


def test_stop_ends_a_running_job(ray_head: tuple[str, str]) -> None:
    launcher = RayJobLauncher(*ray_head)
    launcher.submit("job_t2-a1", f'{sys.executable} -c "import time; time.sleep(600)"', env={}, metadata={})
    _wait(launcher, "job_t2-a1", {"RUNNING"})
    t0 = time.time()
    assert launcher.stop("job_t2-a1")
    assert _wait(launcher, "job_t2-a1", {RAY_STOPPED}) == RAY_STOPPED
    assert time.time() - t0 < 30


def test_the_jobs_api_wants_the_pools_token(ray_head: tuple[str, str]) -> None:
    """No token, or a wrong one: refused before anything runs (the unauthenticated POST that ran a command
    as root in the issue)."""
    address, token = ray_head
    assert token and len(token) == 64
    for wrong in (None, "0" * 64):
        with pytest.raises(AuthenticationError):
            RayJobLauncher(address, wrong).status("job_t1-a1")
    body = json.dumps({"entrypoint": "id"}).encode()
    for headers in ({}, {"Authorization": "Bearer " + "0" * 64}):
        request = urllib.request.Request(f"{address}/api/jobs/", data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code in (401, 403)
