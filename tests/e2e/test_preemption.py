"""Preemption for priority end to end on the real embedded platform (API, Celery worker, local Ray, SQLite),
with a pool of one slot so that two jobs cannot both fit.

A low-priority SFT job checkpoints while it runs; a high-priority job arrives and needs its slot. The low job
goes RUNNING -> PREEMPTING -> QUEUED (its driver saves a checkpoint and exits cleanly on the stop request),
the high job runs to SUCCEEDED, then the low job is readmitted and its second attempt resumes from the
checkpoint it saved on the way out: its steps continue at k+1, none is trained twice, and it finishes all of
them. No slot is ever held twice. Once per backend of the low job: torch, and megatron (one rank, whose
checkpoint is a torch_dist one that its second attempt loads)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from bench.harness import ROOT, RunningPlatform
from client.sdk import RelaxClient
from runtime.launcher import RayJobLauncher, submission_id
from tests.e2e.watch import SlotWatch

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The low job, per backend: its steps, its save interval and its spec's backend-specific part (the high job
# stays on torch: it only has to need the slot). A step of the tiny model takes ~40 ms here on either backend,
# and from the low job's first checkpoint to its driver seeing the stop request takes ~2.5-3.5 s (report,
# poll, submit, pass, next report), so the steps after the first save must outlast that several times over.
# The test fails loudly if the job finished first.
#   torch: 300 steps (~12 s), a save every 10.
#   megatron: one rank (the pool has one slot), torch_dist checkpoints (its default `ckpt-format`), no dropout
#   (megatron-core's default is 0.1; see examples/grpo-arith-megatron.yaml). Its attempts take ~6 s longer to
#   start (importing megatron-core), so fewer steps: 150 (~5.5 s of runway after the first save).
BACKENDS: dict[str, tuple[int, int, dict[str, object]]] = {
    "torch": (300, 10, {}),
    "megatron": (
        150,
        10,
        {"train-backend": "megatron", "hidden-dropout": 0.0, "attention-dropout": 0.0},
    ),
}


@pytest.fixture(scope="module")
def platform(one_slot_platform: RunningPlatform) -> RunningPlatform:
    """The one-slot platform of tests/e2e/conftest.py (the low job takes the whole pool; the scheduler reconciles,
    PREEMPTING -> QUEUED, every second), shared with test_multinode, whose nodes are down by now."""
    return one_slot_platform


def _sft_spec(**overrides: object) -> dict:
    spec = dict(yaml.safe_load((ROOT / "examples" / "sft-arith.yaml").read_text())["spec"])
    spec.pop("save-hf")
    spec.update(
        {
            "hf-checkpoint": "artifacts://models/tiny",
            "rollout-batch-size": 8,
            "global-batch-size": 8,
            "max-tokens-per-gpu": 1024,
        }
    )
    spec.update(overrides)
    return spec


def _wait(c: RelaxClient, job_id: str, what, timeout: float, platform: RunningPlatform) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    job = c.get_job(job_id)
    while time.time() < deadline:
        job = c.get_job(job_id)
        if what(job):
            return job
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break  # ended without getting there (a low job that finished before the preemption landed)
        time.sleep(0.25)
    events = "\n".join(
        f"  {e['time']} {e['kind']} {e['from_status'] or ''}->{e['to_status'] or ''} {e['reason']}"
        for e in c.events(job_id)
    )
    raise AssertionError(f"{job_id} is {job['status']} ({job['status_reason']})\n{events}\n{platform.log()}")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_priority_preemption_checkpoints_requeues_and_resumes(
    platform: RunningPlatform, backend: str
) -> None:
    num_steps, save_interval, backend_spec = BACKENDS[backend]
    c = RelaxClient(platform.url, platform.key)
    pool = c.pools()[0]
    assert sum(n["gpus"] for n in pool["nodes"] if n["alive"]) == 1, pool  # (test_multinode's nodes: down)

    with SlotWatch(c) as watch:
        # 1. A low-priority job takes the only slot and checkpoints as it goes.
        low = c.submit_job(
            spec=_sft_spec(**{"num-rollout": num_steps, "save-interval": save_interval, **backend_spec}),
            name=f"low-sft-{backend}",
            priority_class="low",
        )
        assert low["preemptible"] and low["priority"] < 0
        _wait(c, low["id"], lambda j: j["status"] == "RUNNING", 120, platform)
        _wait(c, low["id"], lambda j: bool(c.checkpoints(j["id"])), 60, platform)

        # 2. A high-priority job needs that slot.
        high = c.submit_job(
            spec=_sft_spec(**{"num-rollout": 4}), name=f"high-sft-{backend}", priority_class="high"
        )
        assert high["priority"] > low["priority"] and not high["preemptible"]

        # 3. The low job is preempted and requeued; the high job runs to the end.
        requeued = _wait(c, low["id"], lambda j: j["preemptions"] == 1, 60, platform)
        assert requeued["status"] in ("QUEUED", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED")
        high_done = _wait(c, high["id"], lambda j: j["status"] == "SUCCEEDED", 120, platform)
        assert high_done["attempt"] == 1 and high_done["preemptions"] == 0

        # 4. The low job is readmitted, resumes and finishes every step.
        done = _wait(c, low["id"], lambda j: j["status"] == "SUCCEEDED", 120, platform)

    for job_id in (low["id"], high["id"]):  # the timeline, for whoever reads a failure (or runs with -s)
        for e in c.events(job_id):
            if e["kind"] not in ("checkpoint_saved", "checkpoint_removed"):
                print(job_id[-6:], e["time"], e["kind"], e["from_status"], e["to_status"], e["reason"])

    # Its transitions, each with a reason.
    transitions = [e for e in c.events(low["id"]) if e["kind"] == "transition"]
    assert [e["to_status"] for e in transitions] == [
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
        "PREEMPTING",
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ], transitions
    assert all(e["reason"] for e in transitions)
    preempting = transitions[4]
    assert preempting["from_status"] == "RUNNING"
    assert high["id"] in preempting["reason"] and "priority" in preempting["reason"], preempting
    assert transitions[5]["from_status"] == "PREEMPTING" and "preempt" in transitions[5]["reason"], (
        transitions[5]
    )
    # The high job was admitted only after the low job had left the slot (event ids are one sequence).
    high_admitted = next(e for e in c.events(high["id"]) if e["to_status"] == "ADMITTED")
    assert high_admitted["id"] > transitions[5]["id"]
    assert done["attempt"] == 2 and done["preemptions"] == 1
    assert done["progress_step"] == done["total_steps"] == num_steps

    # The first attempt saved a checkpoint on the stop request, then its Ray job ended on its own.
    events = c.events(low["id"])
    stop_at = next(e for e in events if e["kind"] == "stop_requested")
    k = int(stop_at["reason"].split()[-1]) - 1  # "after step <k+1>"
    assert 0 <= k < num_steps - 1
    ckpts = c.checkpoints(low["id"])
    first = [ck for ck in ckpts if ck["attempt"] == 1]
    assert first and max(ck["step"] for ck in first) == k, ckpts
    save = Path(done["spec"]["save"])
    assert any(Path(ck["path"]) == save / f"iter_{k:07d}" for ck in first), first
    # (saved on the way out, or just before as a periodic save of that very step)
    assert any(e["kind"] == "checkpoint_saved" and f"step {k}:" in e["reason"] for e in events), k
    if backend == "megatron":  # a torch_dist checkpoint (dist_checkpointing shards), the megatron layout
        folder = save / f"iter_{k:07d}"
        assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp")), sorted(folder.iterdir())
        state = json.loads((folder / "trainer_state.json").read_text())
        assert state["layout"] == "relax-megatron/1" and state["has_optimizer"], state
    ray = RayJobLauncher(c.pools()[0]["ray_address"], platform.ray_token)
    first_run = ray.status(submission_id(low["id"], 1))
    assert first_run is not None and first_run.status == "SUCCEEDED", first_run  # exited cleanly, not killed

    # The second attempt loaded that checkpoint and continued at step k+1.
    resumed = next(e for e in events if e["kind"] == "resumed")
    assert resumed["id"] > stop_at["id"] and resumed["reason"].endswith(f"iteration {k}"), resumed
    logs = c.logs(low["id"], limit=10000)["data"]
    assert any(
        line["attempt"] == 2 and line["message"] == f"resumed from {save} at iteration {k}" for line in logs
    ), [line["message"] for line in logs if line["attempt"] == 2][:20]
    steps = [p["step"] for p in c.metrics(low["id"], names=["train/loss"])["train/loss"]]
    assert sorted(steps) == list(range(num_steps)), steps  # every step once: none redone, none skipped
    assert any(ck["attempt"] == 2 and ck["step"] == num_steps - 1 for ck in ckpts), ckpts  # the final save

    # Never more slots held than the pool has, and never both jobs at once.
    assert watch.samples > 10 and not watch.problems, watch.problems
    assert all(len(h) <= 1 for h in watch.holders_seen), watch.holders_seen
    assert [set(h) for h in watch.holders_seen if h][:3] == [{low["id"]}, {high["id"]}, {low["id"]}]
    assert c.pools()[0]["allocated_gpus"] == 0
