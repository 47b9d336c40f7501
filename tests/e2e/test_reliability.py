"""Crashes of the real embedded platform (API, Celery worker, beat, local Ray, SQLite), each a SIGKILL, and
what the platform does about them (docs/reliability.md). One tiny SFT job lives through all of them, in this
order (each kill of the driver costs the job a new attempt, ~15 s here, so one job keeps the module short):

1. the Celery worker (once the job's driver is on Ray), then the beat while the worker restarts: the
   supervisor restarts each, `/readyz` answers 503 naming them until the new worker heartbeats and the new
   beat's tick runs, and the job carries on (same attempt, running, steps advancing);
2. the embedded main process: no worker, beat, API server or Ray process outlives it by more than a few
   seconds, and a platform started again on the same RELAX_HOME requeues the job that was RUNNING (its Ray
   job is gone with the old Ray: `driver_lost: …`) and resumes it from its checkpoint, instead of leaving it
   RUNNING;
3. everything at once (the main process and every process under it, Ray's and the driver included, as a
   power cut would): nothing of the home is left running, and a restart resumes the job again;
4. the job's driver: the reconciler finds its Ray job FAILED by SIGKILL, requeues it (`driver_lost: …`, not
   an unrelated exception from the log), and the next attempt resumes from its latest checkpoint and
   SUCCEEDS, every step trained, each metric point of the job's history stored once (bench/chaos.py's
   check, which runs many more trials of each kill at random points).

The job: the tiny model, batches of 8 (~25 ms a step here), a checkpoint every 10 steps, 500 steps, so that
each kill lands while it trains. The tests run in file order and share the job: a failure early makes the
later ones fail too (their messages say where the job stands)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from bench.chaos import check_metrics, home_processes, kill_everything, tiny_spec
from bench.chaos import driver_pids as _driver_pids
from bench.chaos import platform_state as _state
from bench.chaos import readyz as _readyz
from bench.harness import RunningPlatform, start_platform
from client.sdk import RelaxClient
from runtime.launcher import RayJobLauncher
from tests.e2e.conftest import THREE_SLOT_ENV, stop_later

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS, SAVE_EVERY = 500, 10
ENV = THREE_SLOT_ENV  # reconcile every second (a platform started again on the home: as it was started)


@pytest.fixture(scope="module")
def platform(three_slot_platform: RunningPlatform):  # type: ignore[no-untyped-def]
    """{"platform": the running platform (the second test replaces it with the restarted one), "job": id}. The
    platform: tests/e2e/conftest.py's `three_slot_platform` (test_elastic_rollout's, test_megatron_learns' and
    test_network_exposure's before, their jobs ended), killed and started again on its home by these tests; the
    last one started is stopped here."""
    held = {"platform": three_slot_platform}
    try:
        p = held["platform"]
        held["job"] = RelaxClient(p.url, p.key).submit_job(
            spec=tiny_spec(STEPS, SAVE_EVERY), name="survivor"
        )["id"]
        yield held
    finally:
        if held["platform"] is not three_slot_platform:
            stop_later(held["platform"])


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
    pids = _driver_pids(job_id)
    assert pids, f"no driver process of {job_id}"
    return pids[0]


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


def test_a_killed_worker_and_beat_are_restarted_while_readyz_fails_and_the_job_carries_on(
    platform: dict,
) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    assert _readyz(p)[0] == 200
    # Once the job's driver is on Ray (its start, ~15 s, overlaps the worker's restart):
    _wait(c, job_id, lambda j: j["status"] in ("STARTING", "RUNNING"), 120, p)
    ray = RayJobLauncher(c.pools()[0]["ray_address"], p.ray_token)
    deadline = time.time() + 60
    while ray.status(f"{job_id}-a1") is None and time.time() < deadline:
        time.sleep(0.2)

    old = _state(p)["parts"]
    os.kill(old["worker"]["pid"], signal.SIGKILL)
    t0, seen_down, back, beat_killed = time.time(), {}, None, False
    while time.time() - t0 < 60:
        status, body = _readyz(p)
        for part in body.get("down", "").split(",") if status == 503 else ():
            seen_down.setdefault(part, body)
        if "worker" in seen_down and not beat_killed:  # the beat dies while the worker restarts
            os.kill(old["beat"]["pid"], signal.SIGKILL)
            beat_killed = True
        if "beat" in seen_down and status == 200:
            back = time.time() - t0
            break
        time.sleep(0.1)
    assert {"worker", "beat"} <= set(seen_down), seen_down
    assert seen_down["worker"]["worker"] == "down" and seen_down["worker"]["api"] == "up"
    assert seen_down["beat"]["beat"] == "down"
    assert back is not None, f"/readyz not ready again 60 s after the worker was killed:\n{p.log()}"
    for part in ("worker", "beat"):
        new = _state(p)["parts"][part]
        assert new["pid"] != old[part]["pid"] and new["restarts"] == 1 and new["state"] == "running", new
        assert not _alive(old[part]["pid"])
    print(f"worker and beat restarted; /readyz answered 503 until {back:.1f}s after the first kill")

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
    tree = {}
    for proc in psutil.Process(p.proc.pid).children(True):
        try:
            tree[proc.pid] = " ".join(proc.cmdline())[:120]
        except psutil.NoSuchProcess:  # (ZombieProcess too) one that has already exited: none to outlive it
            continue
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


def test_everything_killed_at_once_leaves_nothing_and_a_restart_resumes_the_job(platform: dict) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    _training_on(c, job_id, 2, p)
    killed = kill_everything(p)  # the supervisor, its parts, Ray's daemons and the driver, all at once
    time.sleep(1)
    left = {k: v for k, v in home_processes(p.home).items() if v} | {"drivers": _driver_pids(job_id)}
    assert not any(left.values()), left
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        platform["platform"] = p = start_platform(p.home)
    c = RelaxClient(p.url, p.key)
    _wait(
        c,
        job_id,
        lambda j: j["attempt"] == 3 and j["status"] == "RUNNING" and len(_resumed(c, job_id)) == 2,
        120,
        p,
    )
    lost = _transitions(c, job_id)[8]
    assert lost["from_status"] == "RUNNING" and lost["to_status"] == "QUEUED", lost
    assert lost["reason"].startswith(f"driver_lost: Ray job {job_id}-a2 is gone: the pool's Ray at"), lost
    assert {k: len(v) for k, v in home_processes(p.home).items()} == {
        "api": 1,
        "worker": 1,
        "beat": 1,
        "ray": 1,
    }
    print(
        f"{killed} processes killed at once; the restarted platform resumed the job from {_resumed(c, job_id)}"
    )


def test_a_killed_driver_resumes_from_its_checkpoint_and_the_job_succeeds(platform: dict) -> None:
    p: RunningPlatform = platform["platform"]
    c, job_id = RelaxClient(p.url, p.key), platform["job"]
    job = _training_on(c, job_id, 3, p)
    os.kill(_driver_pid(job_id), signal.SIGKILL)
    done = _wait(c, job_id, lambda j: j["status"] == "SUCCEEDED", 180, p)
    assert done["attempt"] == 4 and done["progress_step"] == done["total_steps"] == STEPS, done

    transitions = _transitions(c, job_id)
    assert [e["to_status"] for e in transitions][11:] == [
        "RUNNING",
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ], transitions
    lost = transitions[12]
    assert lost["from_status"] == "RUNNING", lost
    assert lost["reason"].startswith(
        f"driver_lost: Ray job {job_id}-a3 ended FAILED: the driver was killed by SIGKILL"
    ), lost
    assert (
        "AttributeError" not in lost["reason"]
        and "requeued to resume from its latest checkpoint" in lost["reason"]
    )
    *_, before, last = _resumed(c, job_id)
    # the latest complete checkpoint when it was killed: one of attempt 3's (an async save may have been cut)
    assert job["progress_step"] - 2 * SAVE_EVERY <= last < STEPS and last > before, (before, last, job)
    assert any(ck["step"] == last for ck in c.checkpoints(job_id))
    # the job's history is whole: every step stored once by the attempt that trained it for good, each
    # attempt's points contiguous from its checkpoint, no (attempt, step) twice in any series
    check = check_metrics(
        c.metrics(job_id), c.events(job_id), STEPS, single=False, home=p.home, job_id=job_id
    )
    assert not check.failures and check.attempts == 4, check
    assert c.pools()[0]["allocated_gpus"] == 0
