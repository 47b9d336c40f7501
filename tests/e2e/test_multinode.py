"""A pool of several Ray nodes on one machine, end to end (issue 14 item 3): the embedded platform's Ray head
(pool `local`'s node, one slot) and two more raylets joined to it as separate processes (`python -m api.embedded
join w1 1`, i.e. `ray start --address=<head> --num-cpus 1 --node-name w1 --block`: one CPU slot each). The
pool's nodes follow Ray's node list (three nodes, three slots). A GRPO job (SFT warm-up first) whose actor and
rollout sit on different nodes — the pass's allocations, and Ray's placement groups on those very nodes — trains;
a SIGKILL of the process group of a worker node it uses (its raylet and agents) marks that node down within
seconds, the job is requeued and resumes from its latest checkpoint on the two slots left, finishes every step
and learns; the killed node joins again under its name and is back up; no slot is ever held twice."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
import yaml

from bench.harness import ROOT, RunningPlatform, join_node, stop_node
from client.sdk import RelaxClient
from runtime.launcher import RayJobLauncher
from tests.e2e.conftest import sft_arith_start
from tests.e2e.watch import SlotWatch, until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# 40 steps (the example's warmup cut to 5 of them): a save every 5, the kill after the first save, and enough
# steps after the resume for the reward to rise. `python -m runtime.demo ROOT --set num-rollout=40 --set
# lr-warmup-iters=5`: 0.114 -> 0.203 (first 5 -> last 10; 30 steps: 0.114 -> 0.190, 60 steps cost ~20 s more)
STEPS = 40
SAVE_INTERVAL = 5


@pytest.fixture(scope="module")
def platform(one_slot_platform: RunningPlatform):  # type: ignore[no-untyped-def]
    """The one-slot platform (tests/e2e/conftest.py; the head's node has one slot, as each joined node, and the
    scheduler syncs nodes and reconciles every second) with w1 and w2 joined; both stopped at the end, and the
    pool left with its head's node alone up, as the next module (test_preemption) wants it."""
    p = one_slot_platform
    nodes = {}
    c = RelaxClient(p.url, p.key)
    try:
        for name in ("w1", "w2"):  # one after the other: two raylets starting at once may take the same port
            nodes[name] = join(p, c, name)
        yield p, nodes
    finally:
        for proc in nodes.values():
            stop_node(proc)
        deadline = time.time() + 60
        while time.time() < deadline and set(alive_nodes(c)) & {"w1", "w2"}:
            time.sleep(0.25)
        assert not set(alive_nodes(c)) & {"w1", "w2"}, c.pools()


def alive_nodes(c: RelaxClient) -> dict[str, int]:
    """The pool's nodes that are up, and their slots."""
    (pool,) = c.pools()
    return {n["name"]: n["gpus"] for n in pool["nodes"] if n["alive"]}


def join(p: RunningPlatform, c: RelaxClient, name: str):  # type: ignore[no-untyped-def]
    """Join a raylet of one slot named `name` and wait until the pool has it up. Once more if it exits first (on
    a busy machine Ray's raylet gives up on its agents when they start too slowly: "WaitForDashboardAgentPorts")."""
    for attempt in (1, 2):
        proc = join_node(p, name, 1)
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            if alive_nodes(c).get(name) == 1:
                return proc
            time.sleep(0.5)
        stop_node(proc)
        print(f"node {name}: attempt {attempt} did not come up (exit {proc.returncode})")
    raise AssertionError(f"node {name} did not join\n{p.log()}")


def _grpo_spec(start: str) -> dict[str, Any]:
    spec = dict(yaml.safe_load((ROOT / "examples" / "grpo-arith.yaml").read_text())["spec"])
    for key in ("eval-interval", "eval-prompt-data", "eval-temperature", "save-hf"):
        spec.pop(key)
    assert spec["hf-checkpoint"] == spec["ref-load"] == "job://sft-arith/hf"
    spec["hf-checkpoint"] = spec["ref-load"] = start  # the SFT warm-up's export
    # actor and rollout on slots of their own (not colocated): two slots, which the pass puts on two nodes
    spec.update(
        {"num-rollout": STEPS, "save-interval": SAVE_INTERVAL, "colocate": False, "lr-warmup-iters": 5}
    )
    return spec


def _placement_nodes(ray: RayJobLauncher) -> set[str]:
    """The Ray nodes of every bundle of every placement group Ray holds now (Ray's placement group table)."""
    r = ray._client._do_request("GET", "/api/v0/placement_groups?limit=1000&detail=1")
    assert r.status_code == 200, r.text
    rows = r.json()["data"]["result"]["result"]
    return {
        b["node_id"] for row in rows if row["state"] == "CREATED" for b in row["bundles"] if b.get("node_id")
    }


@pytest.mark.timeout(600)
def test_a_job_across_nodes_survives_losing_one(platform: tuple[RunningPlatform, dict], tmp_path) -> None:  # type: ignore[no-untyped-def]
    p, nodes = platform
    c = RelaxClient(p.url, p.key)
    head = next(n["name"] for n in c.pools()[0]["nodes"])  # the embedded pool's node, named after the host

    # The pool's nodes are Ray's: the head's and the two joined, one slot each.
    def three_nodes():  # type: ignore[no-untyped-def]
        return alive_nodes(c) == {head: 1, "w1": 1, "w2": 1}

    until(three_nodes, 30, c, p)
    (pool,) = c.pools()
    assert pool["total_gpus"] == 3 and len(pool["nodes"]) == 3, pool
    ray = RayJobLauncher(pool["ray_address"], p.ray_token)
    ray_ids = {n.name: n.node_id for n in ray.nodes() if n.alive}
    assert set(ray_ids) == {head, "w1", "w2"}, ray_ids

    start = sft_arith_start(p)  # the GRPO job starts from the SFT warm-up's export

    with SlotWatch(c) as watch:
        job = c.submit_job(spec=_grpo_spec(start), name="grpo-multinode")
        job_id = job["id"]

        # 1. Actor and rollout on two different nodes: the pass's allocations, and Ray's placement groups there.
        running = until(
            lambda: (j := c.get_job(job_id))["status"] == "RUNNING" and j["allocations"] and j,
            120,
            c,
            p,
            job_id,
        )
        where = {a["role"]: a["node"] for a in running["allocations"]}
        # (the reference model rides on the actor's slot)
        assert {"actor", "rollout"} <= set(where) and where["actor"] != where["rollout"], running[
            "allocations"
        ]
        assert _placement_nodes(ray) == {ray_ids[where["actor"]], ray_ids[where["rollout"]]}

        # 2. Once it has a checkpoint, SIGKILL a worker node it runs on: its raylet and agents, all at once.
        until(lambda: c.checkpoints(job_id), 120, c, p, job_id)
        victim = "w2" if "w2" in where.values() else "w1"
        stop_node(nodes.pop(victim), signal.SIGKILL)
        killed_at = time.time()
        until(lambda: victim in watch.down_at, 60, c, p, job_id)
        down_after = watch.down_at[victim] - killed_at
        print(
            f"node {victim} ({[r for r, n in where.items() if n == victim]}) marked down {down_after:.1f}s after the kill"
        )
        assert down_after < 30, down_after

        # 3. Requeued; resumed on the two slots left; the killed node joins again under its name meanwhile.
        resumed = until(
            lambda: (j := c.get_job(job_id))["attempt"] == 2 and j["status"] == "RUNNING" and j,
            120,
            c,
            p,
            job_id,
        )
        where2 = {a["role"]: a["node"] for a in resumed["allocations"]}
        assert victim not in where2.values() and where2["actor"] != where2["rollout"], resumed["allocations"]
        nodes[victim] = join(p, c, victim)
        assert three_nodes()
        done = until(
            lambda: (j := c.get_job(job_id))["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") and j,
            240,
            c,
            p,
            job_id,
        )
    events = c.events(job_id)
    for e in events:
        if e["kind"] not in ("checkpoint_saved", "checkpoint_removed"):
            print(e["time"], e["kind"], e["from_status"], e["to_status"], e["reason"])
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 2 and done["progress_step"] == done["total_steps"] == STEPS

    # It was requeued because its node went down, and its second attempt loaded its latest checkpoint.
    transitions = [e for e in events if e["kind"] == "transition"]
    assert any(e["to_status"] == "QUEUED" and e["from_status"] != "SUBMITTED" for e in transitions), (
        transitions
    )
    assert any(f"/{victim} is down" in (e["reason"] or "") for e in transitions), transitions
    resumed_event = next(e for e in events if e["kind"] == "resumed")
    k = int(resumed_event["reason"].split()[-1])
    first = [ck["step"] for ck in c.checkpoints(job_id) if ck["attempt"] == 1]
    assert first and k == max(first), (k, first)

    # It learned (GRPO from the SFT export): mean reward of the last steps above that of the first steps.
    points = c.metrics(job_id, names=["rollout/reward"])["rollout/reward"]
    reward = {pt["step"]: pt["value"] for pt in points}  # a step redone after the resume: its latest value
    assert sorted(reward) == list(range(STEPS)), sorted(reward)
    values = [reward[s] for s in range(STEPS)]
    first5, last10 = sum(values[:5]) / 5, sum(values[-10:]) / 10
    print(f"rollout/reward {first5:.3f} (first 5 steps) -> {last10:.3f} (last 10 steps)")
    assert last10 > first5 + 0.05, values

    # Never a slot held twice, nor more than a node has.
    assert watch.samples > 20 and not watch.problems, watch.problems
    assert c.pools()[0]["allocated_gpus"] == 0
