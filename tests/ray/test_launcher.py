"""RayJobLauncher against a real local Ray head started the way the embedded platform starts it."""

from __future__ import annotations

import sys
import time

import pytest

from api.embedded import Children, start_ray
from runtime.launcher import RAY_STOPPED, RAY_SUCCEEDED, RayJobLauncher
from scheduler.settings import Settings


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("rayhome")
    children = Children(home / "logs")
    try:
        yield start_ray(children, Settings(home=home))
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


def test_submit_is_idempotent_and_logs_are_readable(ray_address: str) -> None:
    launcher = RayJobLauncher(ray_address)
    cmd = f"{sys.executable} -c \"import os; print('hello from', os.environ['RELAX_JOB_ID'])\""
    assert launcher.submit("job_t1-a1", cmd, env={"RELAX_JOB_ID": "job_t1"}, metadata={}) is True
    assert launcher.submit("job_t1-a1", cmd, env={"RELAX_JOB_ID": "job_t1"}, metadata={}) is False
    assert _wait(launcher, "job_t1-a1", {RAY_SUCCEEDED, "FAILED"}) == RAY_SUCCEEDED
    assert any("hello from job_t1" in line for line in launcher.logs_tail("job_t1-a1"))
    assert launcher.status("job_never-a1") is None


def test_stop_ends_a_running_job(ray_address: str) -> None:
    launcher = RayJobLauncher(ray_address)
    launcher.submit("job_t2-a1", f'{sys.executable} -c "import time; time.sleep(600)"', env={}, metadata={})
    _wait(launcher, "job_t2-a1", {"RUNNING"})
    t0 = time.time()
    assert launcher.stop("job_t2-a1")
    assert _wait(launcher, "job_t2-a1", {RAY_STOPPED}) == RAY_STOPPED
    assert time.time() - t0 < 30
