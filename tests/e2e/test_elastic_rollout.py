"""Elastic rollout on the real embedded platform (issue 14 item 5, docs/reference/elastic-rollout.md): API, Celery
worker and beat, a local Ray, SQLite, a pool of three slots and a pass every second (tests/e2e/conftest.py's
`three_slot_platform`, which tests/e2e/test_reliability.py uses after this module).

A GRPO job with `--autoscaler-config` (min 1, max 2 engines; thresholds that make any step rollout-bound) asks for
one engine: its demand's rollout group is elastic from submission (the YAML read from the team's area). The pass
admits it on two slots; after its first step its driver asks for a second engine (the rollout's share of the step
above scale_out's threshold, a `rollout_wish` in its report), and the pass grows its rollout into the idle third;
its driver follows the grant (two engines). An SFT job of one slot arrives: the pass
takes the lent engine back instead of preempting anyone, holds its slot until the elastic job's driver has
stopped that engine between two steps (its placement group released) and reported it, and admits the SFT job
there. Once the SFT job has
finished, the pass grants the engine again and the driver starts it. The elastic job is never preempted and
never restarted, and no slot is ever held twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness import ROOT, RunningPlatform
from client.sdk import RelaxClient
from tests.e2e.watch import SlotWatch, until
from wire.jobs import TERMINAL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# every step's rollout is above 1% of it (so the driver asks for 2 engines after its first step), never below 0%
AUTOSCALER = "min_engines: 1\nmax_engines: 2\nscale_out: {threshold: 0.01, cooldown_steps: 0}\nscale_in: {threshold: 0.0}\n"


@pytest.fixture(scope="module")
def platform(three_slot_platform: RunningPlatform) -> Iterator[RunningPlatform]:
    """Pool `local` of three slots, a scheduling pass (and reconcile) every second; shared with the next modules
    (test_megatron_learns, test_network_exposure, test_reliability): whatever this module's test leaves running
    is cancelled at its end."""
    p = three_slot_platform
    yield p
    c = RelaxClient(p.url, p.key)
    for job in c.list_jobs(limit=100)["data"]:
        if job["name"] in ("grpo-elastic", "sft-one-slot") and job["status"] not in TERMINAL:
            c.cancel_job(job["id"])
            until(lambda j=job: c.get_job(j["id"])["status"] in TERMINAL, 120, c, p, job["id"])


def _grpo_spec() -> dict[str, Any]:
    """GRPO on the tiny model from scratch, small steps, its engines elastic; more steps than the test needs (it
    cancels the job once it has seen the engines come back)."""
    return {
        "train-backend": "torch",
        "hf-checkpoint": "artifacts://models/tiny",
        "prompt-data": "artifacts://datasets/arith/train.jsonl",
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-batch-size": 4,
        "n-samples-per-prompt": 4,
        "rollout-max-response-len": 8,
        "global-batch-size": 16,
        "num-rollout": 5000,
        "lr": 1e-4,
        "advantage-estimator": "grpo",
        "colocate": False,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "autoscaler-config": "artifacts://autoscaler.yaml",
        "scale-out-timeout": 180.0,
    }


def _sft_spec() -> dict[str, Any]:
    spec = dict(yaml.safe_load((ROOT / "examples" / "sft-arith.yaml").read_text())["spec"])
    for key in ("save", "save-interval", "save-hf"):
        spec.pop(key)
    spec.update(
        {"rollout-batch-size": 8, "global-batch-size": 8, "max-tokens-per-gpu": 1024, "num-rollout": 4}
    )
    spec["resource"] = {"actor": [1, 1]}
    return spec


def _engines(c: RelaxClient, job_id: str) -> list[float]:
    """`rollout/engines` after each step of the job so far, in step order."""
    points = c.metrics(job_id, names=["rollout/engines"]).get("rollout/engines", [])
    return [pt["value"] for pt in sorted(points, key=lambda pt: pt["step"])]


def _rollout_replicas(c: RelaxClient, job_id: str) -> int:
    """The engines the pass allocated the job now (a row each: one GPU, one node), not those it took back that
    the driver has not yet stopped (`releasing`)."""
    return sum(1 for a in c.get_job(job_id)["allocations"] if a["role"] == "rollout" and not a["releasing"])


def _driver_logs(c: RelaxClient, job_id: str) -> list[str]:
    out, after = [], 0
    while True:
        page = c.logs(job_id, after=after, limit=1000)
        out += [line["message"] for line in page["data"]]
        if not page["data"] or page["next_after"] == after:
            return out
        after = page["next_after"]


@pytest.mark.timeout(900)
def test_the_pass_takes_an_elastic_jobs_engine_back_for_another_job_and_grants_it_again(
    platform: RunningPlatform,
) -> None:
    p = platform
    c = RelaxClient(p.url, p.key)
    (pool,) = c.pools()
    assert pool["total_gpus"] == 3, pool
    (Path(c.storage()["area"]) / "autoscaler.yaml").write_text(AUTOSCALER)

    with SlotWatch(c) as watch:
        started = time.time()
        elastic = c.submit_job(spec=_grpo_spec(), name="grpo-elastic")
        eid = elastic["id"]
        rollout = next(g for g in elastic["demand"]["groups"] if g["role"] == "rollout")
        assert (rollout["replicas"], rollout["min_replicas"], rollout["max_replicas"]) == (1, 1, 2), rollout

        # 1. Admitted on two slots; its driver asks for two engines after a step, grown into the third slot
        until(lambda: _rollout_replicas(c, eid) == 2, 240, c, p, eid)
        until(lambda: (e := _engines(c, eid)) and e[-1] == 2.0, 240, c, p, eid)
        grown_at = time.time()

        # 2. A job of one slot: the lent engine is taken back for it, no job preempted; the job is admitted once
        # the elastic job's driver has stopped that engine (its slot held until then)
        # (its engine is stopped between two steps before the job is admitted: count the steps from its submission)
        steps_before = len(_engines(c, eid))
        sft = c.submit_job(spec=_sft_spec(), name="sft-one-slot")
        sid = sft["id"]
        until(lambda: c.get_job(sid)["status"] != "QUEUED", 120, c, p, eid, sid)
        assert _rollout_replicas(c, eid) == 1
        until(lambda: (e := _engines(c, eid)) and e[-1] == 1.0, 120, c, p, eid, sid)
        shrunk_at = time.time()
        done = until(
            lambda: (j := c.get_job(sid))["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") and j,
            240,
            c,
            p,
            sid,
        )
        assert done["status"] == "SUCCEEDED", done

        # 3. It has gone: the engine is granted again and started
        until(lambda: _rollout_replicas(c, eid) == 2, 30, c, p, eid)
        until(lambda: (e := _engines(c, eid)) and e[-1] == 2.0, 240, c, p, eid)
        regrown_at = time.time()
        c.cancel_job(eid)
        ended = until(
            lambda: (j := c.get_job(eid))["status"] in ("CANCELLED", "FAILED", "SUCCEEDED") and j,
            120,
            c,
            p,
            eid,
        )

    print(
        f"grown {grown_at - started:.0f}s after submission; shrunk {shrunk_at - grown_at:.0f}s after the SFT job "
        f"came; grown again {regrown_at - shrunk_at:.0f}s after that; {len(_engines(c, eid))} steps in all"
    )
    assert ended["status"] == "CANCELLED", ended
    assert ended["attempt"] == 1 and ended["preemptions"] == 0  # never preempted, never restarted
    engines = _engines(c, eid)
    # one engine (the pass grows the rollout only once the driver has asked, after a step), two, one from a step
    # after the SFT job came, then two again; each change once
    changes = [engines[0]] + [b for a, b in zip(engines, engines[1:], strict=False) if a != b]
    assert changes == [1.0, 2.0, 1.0, 2.0], engines
    assert engines.index(1.0, engines.index(2.0)) >= steps_before - 1, (engines, steps_before)
    events = c.events(eid)
    wishes = [e["reason"] for e in events if e["kind"] == "rollout_wish"]
    # once: rollout-bound with one engine while the SFT job held the other, it still asks for the two it asked for
    assert len(wishes) == 1 and wishes[0].startswith("the driver asks for 2 rollout engines after step ")
    assert wishes[0].endswith("of the step > scale_out 0.01"), wishes
    resized = [e["reason"] for e in events if e["kind"] == "rollout_resized"]
    assert len(resized) == 3, resized
    assert resized[0].startswith(
        "rollout 1 -> 2: the pass granted 1 engine (idle GPUs in the pool; the job asked for 1 more: rollout "
    )
    assert resized[1].startswith(f"rollout 2 -> 1: the pass took back 1 engine ({sid} needs GPUs")
    assert resized[2].startswith("rollout 1 -> 2: the pass granted 1 engine")
    # the SFT job was admitted only once the driver had stopped the engine taken back for it
    stopped = [e for e in events if e["kind"] == "rollout_engines_stopped"]
    assert stopped and stopped[0]["reason"].startswith("the driver has stopped the 1 rollout engine"), stopped
    sft_admitted = next(
        e for e in c.events(sid) if e["kind"] == "transition" and e["to_status"] == "ADMITTED"
    )
    when = datetime.fromisoformat
    assert when(stopped[0]["time"]) <= when(sft_admitted["time"]), (stopped[0], sft_admitted)
    logs = _driver_logs(c, eid)
    assert any("rollout scaled in 2 -> 1 engines" in m and "the pass took them back" in m for m in logs), logs
    assert sum("rollout scaled out 1 -> 2 engines" in m and "the pass granted them" in m for m in logs) >= 1
    assert watch.samples > 20 and not watch.problems, watch.problems
    assert c.pools()[0]["allocated_gpus"] == 0
