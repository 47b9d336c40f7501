"""Crashes of the real embedded platform (API, Celery worker, beat, local Ray, SQLite), each a SIGKILL, and
what the platform does about them (docs/reliability.md). One tiny SFT job lives through all three, in this
order (each kill costs the job a new attempt, ~15 s here, so one job keeps the module near 100 s):

1. the Celery worker (once the job's driver is on Ray): the supervisor restarts it, `/readyz` answers 503
   naming it until the new worker heartbeats, and the job carries on (same attempt, running, steps advancing);
2. the embedded main process: no worker, beat, API server or Ray process outlives it by more than a few
   seconds, and a platform started again on the same RELAX_HOME requeues the job that was RUNNING (its Ray
   job is gone with the old Ray: `driver_lost: …`) and resumes it from its checkpoint, instead of leaving it
   RUNNING;
3. the job's driver: the reconciler finds its Ray job FAILED by SIGKILL, requeues it (`driver_lost: …`, not
   an unrelated exception from the log), and the next attempt resumes from its latest checkpoint and
   SUCCEEDS, every step trained.

The job: the tiny model, batches of 8 (~40 ms a step here), a checkpoint every 10 steps, 300 steps, so that
each kill lands while it trains. The tests run in file order and share the job: a failure early makes the
later ones fail too (their messages say where the job stands)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from bench.harness import ROOT, RunningPlatform, start_platform, stop_platform
from client.sdk import RelaxClient
from runtime.launcher import RayJobLauncher

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS, SAVE_EVERY = 300, 10
ENV = {"RELAX_SCHEDULER_TICK_SECONDS": "1"}  # reconcile every second


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """{"platform": the running platform (the second test replaces it with the restarted one), "job": id}"""
    home = tmp_path_factory.mktemp("platform") / "home"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        held = {"platform": start_platform(home)}
    try:
        p = held["platform"]
        r = p.relaxctl("models", "tiny")
        assert r.returncode == 0, r.stdout + r.stderr
        held["job"] = RelaxClient(p.url, p.key).submit_job(spec=_spec(), name="survivor")["id"]
        yield held
    finally:
        stop_platform(held["platform"])


def _spec() -> dict:
    spec = dict(yaml.safe_load((ROOT / "examples" / "sft-arith.yaml").read_text())["spec"])
    spec.pop("save-hf")
    spec.update(
        {
            "rollout-batch-size": 8,
            "global-batch-size": 8,
            "max-tokens-per-gpu": 1024,
            "num-rollout": STEPS,
            "save-interval": SAVE_EVERY,
        }
    )
    return spec


def _state(p: RunningPlatform) -> dict:
    return json.loads((p.home / "run" / "platform.json").read_text())


def _readyz(p: RunningPlatform) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(f"{p.url}/readyz", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except OSError:
        return None, {}


def _wait(c: RelaxClient, job_id: str, what, timeout: float, p: RunningPlatform) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = c.get_job(job_id)
        if what(job):
            return job
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.25)
    events = "\n".join(f"  {e['kind']} {e['to_status'] or ''} {e['reason']}" for e in c.events(job_id))
    raise AssertionError(f"{job_id} is {job['status']} ({job['status_reason']})\n{events}\n{p.log()}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _driver_pid(job_id: str) -> int:
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv and "python" in Path(argv[0]).name and "runtime.bootstrap" in argv and job_id in argv:
            return proc.pid
    raise AssertionError(f"no driver process of {job_id}")


def _transitions(c: RelaxClient, job_id: str) -> list[dict]:
    return [e for e in c.events(job_id) if e["kind"] == "transition"]


def _resumed(c: RelaxClient, job_id: str) -> list[int]:
    """The iterations the job's attempts resumed from, in order."""
    return [int(e["reason"].split()[-1]) for e in c.events(job_id) if e["kind"] == "resumed"]


def _training_on(c: RelaxClient, job_id: str, attempt: int, p: RunningPlatform) -> dict:
    """The job RUNNING on `attempt`, with a checkpoint saved by that attempt, and far from its last step."""
    job = _wait(c, job_id, lambda j: j["status"] == "RUNNING" and j["attempt"] == attempt, 120, p)
    _wait(c, job_id, lambda j: any(ck["attempt"] == attempt for ck in c.checkpoints(j["id"])), 60, p)
    job = c.get_job(job_id)
    assert job["status"] == "RUNNING" and job["progress_step"] < STEPS - 30, job  # it trains on when killed
    return job


def test_a_killed_worker_is_restarted_while_readyz_fails_and_the_job_carries_on(platform: dict) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    assert _readyz(p)[0] == 200
    # Once the job's driver is on Ray (its start, ~15 s, overlaps the worker's restart):
    _wait(c, job_id, lambda j: j["status"] in ("STARTING", "RUNNING"), 120, p)
    ray = RayJobLauncher(c.pools()[0]["ray_address"], p.ray_token)
    deadline = time.time() + 60
    while ray.status(f"{job_id}-a1") is None and time.time() < deadline:
        time.sleep(0.2)

    old = _state(p)["parts"]["worker"]
    os.kill(old["pid"], signal.SIGKILL)
    t0, seen_down, back = time.time(), None, None
    while time.time() - t0 < 60:
        status, body = _readyz(p)
        if status == 503 and seen_down is None:
            seen_down = body
        if seen_down is not None and status == 200:
            back = time.time() - t0
            break
        time.sleep(0.1)
    assert seen_down is not None and "worker" in seen_down["down"].split(","), seen_down
    assert seen_down["worker"] == "down" and seen_down["api"] == "up"
    assert back is not None, f"/readyz not ready again 60 s after the worker was killed:\n{p.log()}"
    new = _state(p)["parts"]["worker"]
    assert new["pid"] != old["pid"] and new["restarts"] == 1 and new["state"] == "running"
    assert not _alive(old["pid"])
    print(f"worker restarted; /readyz answered 503 until {back:.1f}s after the kill")

    # The job carries on: same attempt, running, its steps advancing under the new worker.
    job = _wait(
        c, job_id, lambda j: j["status"] == "RUNNING" and (j["progress_step"] or 0) > SAVE_EVERY, 120, p
    )
    assert job["attempt"] == 1 and [e["to_status"] for e in _transitions(c, job_id)] == [
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
    ], job


def test_a_killed_platform_leaves_no_orphans_and_its_restart_resumes_the_running_job(platform: dict) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    _training_on(c, job_id, 1, p)
    parts = {name: part["pid"] for name, part in _state(p)["parts"].items()}
    assert set(parts) == {"ray", "worker", "beat", "api"}
    tree = {proc.pid: " ".join(proc.cmdline())[:120] for proc in psutil.Process(p.proc.pid).children(True)}
    assert set(parts.values()) <= set(tree)

    saved = max(ck["step"] for ck in c.checkpoints(job_id))
    os.kill(p.proc.pid, signal.SIGKILL)
    p.proc.wait(10)
    t0 = time.time()
    while time.time() - t0 < 10 and any(_alive(pid) for pid in tree):
        time.sleep(0.2)
    gone_in = time.time() - t0
    orphans = {pid: cmd for pid, cmd in tree.items() if _alive(pid)}
    assert not orphans, f"alive {gone_in:.0f}s after the platform was killed: {orphans}"
    assert gone_in < 8, gone_in
    print(
        f"every process of the killed platform ({len(tree)}, the job's driver included) gone in {gone_in:.1f}s"
    )

    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        platform["platform"] = p = start_platform(p.home)
    c = RelaxClient(p.url, p.key)
    _wait(c, job_id, lambda j: j["attempt"] == 2 and j["status"] == "RUNNING" and _resumed(c, job_id), 120, p)
    transitions = _transitions(c, job_id)
    assert [e["to_status"] for e in transitions][3:] == [
        "RUNNING",
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
    ]
    lost = transitions[4]
    assert lost["from_status"] == "RUNNING", lost
    assert lost["reason"].startswith(f"driver_lost: Ray job {job_id}-a1 is gone: the pool's Ray at"), lost
    assert "requeued to resume from its latest checkpoint" in lost["reason"], lost
    [k] = _resumed(c, job_id)
    assert k >= saved, (k, saved)  # its latest checkpoint on disk (what was registered, or saved after)


def test_a_killed_driver_resumes_from_its_checkpoint_and_the_job_succeeds(platform: dict) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    job = _training_on(c, job_id, 2, p)
    os.kill(_driver_pid(job_id), signal.SIGKILL)
    done = _wait(c, job_id, lambda j: j["status"] == "SUCCEEDED", 180, p)
    assert done["attempt"] == 3 and done["progress_step"] == done["total_steps"] == STEPS, done

    transitions = _transitions(c, job_id)
    assert [e["to_status"] for e in transitions][7:] == [
        "RUNNING",
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ], transitions
    lost = transitions[8]
    assert lost["from_status"] == "RUNNING", lost
    assert lost["reason"].startswith(
        f"driver_lost: Ray job {job_id}-a2 ended FAILED: the driver was killed by SIGKILL"
    ), lost
    assert (
        "AttributeError" not in lost["reason"]
        and "requeued to resume from its latest checkpoint" in lost["reason"]
    )
    first, second = _resumed(c, job_id)
    # the latest complete checkpoint when it was killed: one of attempt 2's (an async save may have been cut)
    assert job["progress_step"] - 2 * SAVE_EVERY <= second < STEPS and second > first, (first, second, job)
    assert any(ck["step"] == second for ck in c.checkpoints(job_id))
    # the last attempt trained every step from its checkpoint on (what a killed driver had not yet reported
    # of the steps before is not the reconciler's to recover)
    steps = {pt["step"] for pt in c.metrics(job_id, names=["train/loss"])["train/loss"]}
    assert set(range(second + 1, STEPS)) <= steps, sorted(set(range(second + 1, STEPS)) - steps)
    assert c.pools()[0]["allocated_gpus"] == 0
