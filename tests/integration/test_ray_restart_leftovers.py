"""What a dead embedded Ray head leaves behind is stopped before the next one starts, its jobs' drivers
included (api/embedded.py `stop_ray_of(temp, token_path=…)`). A driver runs in a session of its own and
names neither Ray's temp dir nor its session on its command line: after a SIGKILL of the GCS one trained on
beside the attempt that resumed its job, two drivers on one slot (bench/chaos.py, a `ray` trial). Every
process that Ray starts inherits the home's `RAY_AUTH_TOKEN_PATH`, which is how they are found. And a job
that was STARTING on the dead head is launched again as soon as the new head runs; the new head's ports are
distinct."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

from api.embedded import ray_processes, stop_ray_of


def _sleeper(token_path: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {"RAY_AUTH_TOKEN_PATH": str(token_path)}
    return subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)


def test_a_dead_heads_drivers_are_stopped_and_another_rays_are_not(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "home" / "ray_tokens" / "local", tmp_path / "other" / "ray_tokens" / "local"
    driver, other = _sleeper(ours), _sleeper(theirs)
    try:
        time.sleep(0.2)  # exec'd: its environment is readable
        temp = tmp_path / "home" / "ray"
        assert [p.pid for p in ray_processes(temp)] == []  # by the temp dir alone it is invisible
        assert [p.pid for p in ray_processes(temp, ours)] == [driver.pid]
        assert stop_ray_of(temp, timeout=5, token_path=ours) == 1
        assert driver.wait(5) is not None
        assert other.poll() is None and psutil.Process(other.pid).is_running()
    finally:
        for proc in (driver, other):
            proc.kill()
            proc.wait()


def test_a_starting_job_launched_before_the_embedded_ray_restarted_is_launched_again_at_once(
    api, monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A job STARTING when the embedded Ray head died (its driver not yet up, its bootstrap secret unused):
    the new head cannot know its Ray job, so the reconciler launches it again on the next pass instead of
    waiting out `launch_grace_seconds` (60 s) with the slots held and no driver (an `everything` chaos trial:
    75 s). Without a supervised Ray (or one that has run since before the launch) the grace stands."""
    import json

    from scheduler import health, tasks
    from scheduler.services.lifecycle import JobLifecycle
    from tests.factories import make_job

    client, settings, broker = api
    db = client.app.state.db
    submitted: list[str] = []

    class NewHead:  # knows no job; takes submissions
        def status(self, sub_id: str) -> None:
            return None

        def submit(self, sub_id: str, entrypoint: str, **_: object) -> bool:
            submitted.append(sub_id)
            return True

    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: NewHead())
    ctx = tasks.WorkerContext(settings=settings, app=broker)
    ctx.__dict__["db"] = db
    job_id = make_job(db, artifact_root=settings.artifacts)
    with db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job_id, "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job_id, "STARTING", expected_from="ADMITTED", reason="test")
        svc.get(job_id).ray_submission_id = f"{job_id}-a1"

    tasks.reconcile_pool(ctx, "local")  # no supervisor: within the launch grace, left alone
    assert submitted == []
    state = tmp_path / "platform.json"
    parts = {"ray": {"state": "running", "since": time.time() - 3600}}
    state.write_text(json.dumps({"pid": 1, "updated_at": time.time(), "parts": parts}))
    monkeypatch.setenv(health.SUPERVISOR_STATE_ENV, str(state))
    tasks.reconcile_pool(ctx, "local")  # the head has run since before the launch: left alone
    assert submitted == []
    parts["ray"]["since"] = time.time()  # restarted after the launch
    state.write_text(json.dumps({"pid": 1, "updated_at": time.time(), "parts": parts}))
    tasks.reconcile_pool(ctx, "local")
    assert submitted == [f"{job_id}-a1"]


def test_a_heads_ports_are_distinct_and_never_the_apis(tmp_path: Path) -> None:
    """One `free_port()` after another could hand out a port twice: `ray start` then refused to start ("…
    is trying to use a port number … used by other components") and a platform starting again after a crash
    exited (a chaos trial). The head's ports are now chosen together (`api.embedded.free_ports`)."""
    from api.embedded import RayHead, free_ports
    from scheduler.settings import ApiSettings, Settings

    settings = Settings(home=tmp_path / "home", api=ApiSettings(port=free_ports(1)[0]))
    for _ in range(50):
        argv, _env = RayHead(settings).command()
        ports = [int(argv[i + 1]) for i, a in enumerate(argv) if a.endswith("-port")]
        assert len(ports) == 9 and len(set(ports)) == 9 and settings.api.port not in ports, argv
