"""The whole platform end to end on this machine: CLI -> API -> database -> scheduling pass ->
Celery worker -> Ray job -> driver with Ray actors -> reports back. SFT warm-up, then GRPO that learns."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.harness import ROOT, RunningPlatform
from client.sdk import RelaxClient
from runtime.launcher import RayJobLauncher
from tests.e2e.conftest import log_problems
from wire.jobs import TERMINAL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _wait_status(c: RelaxClient, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = c.get_job(job_id)
        if job["status"] in statuses:
            return job
        time.sleep(0.25)
    raise AssertionError(f"{job_id} stuck in {c.get_job(job_id)['status']}")


# the example's 300 are measured by `python -m bench.example_run` (README.md, docs/reference/runtime.md); here 60,
# the warmup 10 of them (the example's 20 are for 300)
GRPO_STEPS, GRPO_WARMUP = 60, 10


def test_sft_then_grpo_learns(platform: RunningPlatform, sft_arith: dict, tmp_path: Path) -> None:
    """The SFT warm-up (tests/e2e/conftest.py's `sft_arith`: examples/sft-arith.yaml through `relaxctl submit
    --wait`, SUCCEEDED, no error in its log; run here, or by a module before on this platform), then GRPO from
    its export."""
    import yaml

    # While GRPO runs, the API already serves its metrics.
    seen_while_running: dict[str, set[str]] = {}
    c = RelaxClient(platform.url, platform.key)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            jobs = c.list_jobs(name="grpo-arith")["data"]
            if jobs and jobs[0]["status"] == "RUNNING":
                series = c.metrics(jobs[0]["id"])
                if series:
                    seen_while_running[jobs[0]["id"]] = {n.split("/")[0] for n in series}
            time.sleep(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    doc = yaml.safe_load((ROOT / "examples" / "grpo-arith.yaml").read_text())
    doc["spec"]["num-rollout"] = GRPO_STEPS  # the cosine schedule then decays over 60 steps
    doc["spec"]["lr-warmup-iters"] = GRPO_WARMUP
    job_file = tmp_path / "grpo-arith.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    try:
        r = platform.relaxctl("submit", str(job_file), "--wait")
    finally:
        stop.set()
        watcher.join(5)
    assert r.returncode == 0, r.stdout + r.stderr + platform.log()
    job = c.list_jobs(name="grpo-arith")["data"][0]
    assert job["status"] == "SUCCEEDED"
    assert {"rollout", "train", "perf"} <= seen_while_running.get(job["id"], set())

    # It consumed the SFT job's Hugging Face export.
    detail = c.get_job(job["id"])
    sft = sft_arith
    assert detail["spec"]["hf_checkpoint"].startswith(sft["output_dir"])
    assert detail["submitted"]["inputs"][0]["job_id"] == sft["id"]

    # It learned: mean reward of the last 10 steps clearly above the first 5 (measured over 60 steps, warmup 10:
    # 0.119 -> 0.261, and 0.131 -> 0.274 with --seed 1, `python -m runtime.demo ROOT --set num-rollout=60 --set
    # lr-warmup-iters=10`; over 100 steps, warmup 20: 0.13 -> 0.38; 0.67 after the example's 300). A step's
    # reward scatters by ~0.035 about the run's trend, so the difference of the two means by ~0.02 for a run
    # that does not learn: 0.08 is 4 of those.
    reward = [p["value"] for p in c.metrics(job["id"], names=["rollout/reward"])["rollout/reward"]]
    assert len(reward) == GRPO_STEPS, len(reward)
    first, last = sum(reward[:5]) / 5, sum(reward[-10:]) / 10
    print(f"grpo-arith: rollout/reward {first:.3f} (first 5 steps) -> {last:.3f} (last 10 steps)")
    assert first < 0.2 and last > 0.22 and last - first > 0.08, reward

    # Every transition, with time and reason.
    events = [e for e in c.events(job["id"]) if e["kind"] == "transition"]
    assert [e["to_status"] for e in events] == ["QUEUED", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert all(e["time"] and e["reason"] for e in events)

    # The driver's log is readable through the API, and neither job logged an error or a traceback.
    logs = c.logs(job["id"])["data"]
    assert logs and any(line["source"] == "driver" for line in logs)
    assert log_problems(c, job["id"]) == [] and log_problems(c, sft["id"]) == []

    # Checkpoints registered, and <save> in the Relax layout.
    ckpts = c.checkpoints(job["id"])
    assert ckpts and all(ck["size_bytes"] > 0 and Path(ck["path"]).exists() for ck in ckpts)
    save = Path(detail["spec"]["save"])
    iters = sorted(p.name for p in save.glob("iter_*"))
    assert iters and all(len(n) == len("iter_0000000") for n in iters)
    latest = int((save / "latest_checkpointed_iteration.txt").read_text().strip())
    assert f"iter_{latest:07d}" in iters
    rollout_files = sorted((save / "rollout_result" / "train").glob("*.jsonl"))
    assert rollout_files
    first_record = json.loads(rollout_files[0].read_text().splitlines()[0])
    assert {"prompt", "response", "reward"} <= set(first_record)
    assert c.rollouts(job["id"])


def test_cancel_stops_the_ray_job_and_frees_the_slots(platform: RunningPlatform) -> None:
    c = RelaxClient(platform.url, platform.key)
    spec = _long_spec(platform)
    job = c.submit_job(spec=spec, name="long-grpo")
    _wait_status(c, job["id"], {"RUNNING"}, timeout=180)
    assert c.pools()[0]["allocated_gpus"] >= 1
    r = platform.relaxctl("jobs", "cancel", job["id"])
    assert r.returncode == 0 and "CANCELLING" in r.stdout
    done = _wait_status(c, job["id"], {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
    assert done["status"] == "CANCELLED"
    pool = c.pools()[0]
    assert pool["allocated_gpus"] == 0
    info = RayJobLauncher(pool["ray_address"], platform.ray_token).status(done["ray_submission_id"])
    assert info is not None and info.status in ("STOPPED", "SUCCEEDED")  # stopped, or exited on request


def test_bad_spec_is_refused_by_the_cli(platform: RunningPlatform) -> None:
    r = platform.relaxctl("submit", "--", "--train-backend", "torch", "--rollout-batch-size", "many")
    assert r.returncode == 2
    assert "rollout-batch-size" in r.stderr


def _long_spec(platform: RunningPlatform) -> dict:
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "grpo-arith.yaml").read_text())
    spec = dict(doc["spec"])
    spec["num-rollout"] = 10_000
    spec.pop("save-interval", None)
    spec.pop("save", None)
    spec["hf-checkpoint"] = "artifacts://models/tiny"
    return spec


def test_no_secret_in_any_log_of_the_runs(platform: RunningPlatform) -> None:
    """After the runs above (submit, launch, drivers, reports, cancel): no API key, signing key, job token
    or bootstrap secret in any log the platform or Ray wrote, nor in the job logs and events the API
    serves. (Runs last: it reads what the other tests of this module left.)"""
    import re

    from api.embedded import ray_temp_dir
    from scheduler.services.job_tokens import bootstrap_secret, job_token
    from scheduler.settings import Settings

    c = RelaxClient(platform.url, platform.key)
    signing = (platform.home / "secret.key").read_text().strip()
    jobs = c.list_jobs(limit=100)["data"]
    assert jobs
    secrets_ = {"admin key": platform.key, "signing key": signing}
    for job in jobs:
        for attempt in range(1, job["attempt"] + 1):
            secrets_[f"token {job['id']}/{attempt}"] = job_token(signing.encode(), job["id"], attempt)
            secrets_[f"bootstrap {job['id']}/{attempt}"] = bootstrap_secret(
                signing.encode(), job["id"], attempt
            )
    texts: dict[str, str] = {}
    ray_temp = ray_temp_dir(Settings(home=platform.home))  # Ray's session logs, the job drivers' included
    for root in (platform.home, ray_temp):
        for f in root.rglob("*"):
            if f.is_file() and (f.suffix in (".log", ".out", ".err", ".txt") or "logs" in f.parts):
                texts[str(f)] = f.read_text(errors="replace")
    assert any("job-driver" in name or "worker" in name for name in texts), sorted(texts)[:20]
    for job in jobs:
        texts[f"api logs {job['id']}"] = json.dumps(c.logs(job["id"], limit=10_000))
        texts[f"api events {job['id']}"] = json.dumps(c.events(job["id"]))
    leaks = [
        (what, where) for what, value in secrets_.items() for where, text in texts.items() if value in text
    ]
    # Ray's runtime-env agent logs each job's runtime_env as it creates it (runtime_env_agent.log), the
    # bootstrap secret included, as its Jobs API shows it: tolerated there, in Ray's own logs, for an
    # attempt whose driver has exchanged it (spent) or that has ended unclaimed (a job cancelled or failed
    # before its driver's first call): either opens nothing, which is asserted below by trying it. Nothing
    # else may appear anywhere.
    claimed = {
        f"bootstrap {job['id']}/{m.group(1)}"
        for job in jobs
        for e in c.events(job["id"])
        if e["kind"] == "token_claimed" and (m := re.search(r"attempt (\d+)", e["reason"] or ""))
    }
    ended = {
        f"bootstrap {job['id']}/{attempt}"
        for job in jobs
        for attempt in range(1, job["attempt"] + 1)
        if attempt < job["attempt"] or job["status"] in TERMINAL
    }
    tolerated = [
        (what, where) for what, where in leaks if what in claimed | ended and where.startswith(str(ray_temp))
    ]
    for what, _ in tolerated:
        job_id = what.split()[1].split("/")[0]
        r = httpx.post(
            f"{platform.url}/v1/internal/jobs/{job_id}/token",
            headers={"Authorization": f"Bearer {secrets_[what]}"},
            timeout=10,
        )
        assert r.status_code in (401, 409), (what, r.status_code, r.text)
    leaks = [leak for leak in leaks if leak not in tolerated]
    assert not leaks, leaks
