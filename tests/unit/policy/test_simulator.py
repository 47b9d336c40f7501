"""The trace simulator: metrics on hand-made traces, preemption costs, safety after every pass."""

from __future__ import annotations

import functools
import json
import random

import pytest

from bench.scheduler_sim import TraceJob, jain, main, simulate
from scheduler.policy import JobView, PolicyConfig, Queue, fifo, fifo_backfill, schedule
from scheduler.policy.invariants import check


def test_metrics_of_a_two_job_trace():
    trace = [TraceJob("a", 0, 8, 100, "x"), TraceJob("b", 10, 8, 50, "y")]
    res = simulate(trace, fifo_backfill, nodes=1, gpus_per_node=8, window_s=0)
    m = res.metrics
    # a runs 0-100; b waits 90 s, runs 100-150.
    assert m["avg_jct_h"] * 3600 == pytest.approx((100 + 140) / 2)
    assert m["avg_beyond_h"] * 3600 == pytest.approx((0 + 90) / 2)
    assert m["p95_queueing_h"] * 3600 == pytest.approx(0.95 * 90)
    assert m["max_queueing_h"] * 3600 == pytest.approx(90)
    assert m["max_wait_h"] * 3600 == pytest.approx(90)
    assert m["mean_slowdown"] == pytest.approx((1 + 140 / 50) / 2)
    assert m["slowdown_2-8"] == pytest.approx(m["mean_slowdown"])
    assert m["utilisation"] == pytest.approx(1.0)
    assert m["jain_tenants"] == pytest.approx((1 + 2.8) ** 2 / (2 * (1 + 2.8**2)))
    assert m["preemptions"] == 0
    assert res.per_tenant_slowdown == pytest.approx({"x": 1.0, "y": 2.8})


def test_a_preemption_costs_the_work_since_the_checkpoint_plus_the_restart():
    # "b" borrows the only node from t=0; "a" (the owner) arrives at 2000 and reclaims it.
    trace = [TraceJob("b", 0, 8, 4000, "borrower"), TraceJob("a", 2000, 8, 1000, "owner")]
    queues = (Queue("borrower", "shared", "t", 0), Queue("owner", "shared", "t", 8))
    policy = functools.partial(schedule, config=PolicyConfig(reclaim_after_s=0))
    res = simulate(trace, policy, nodes=1, gpus_per_node=8, queues=queues, window_s=0)
    m = res.metrics
    assert m["preemptions"] == 1
    # b had checkpointed at 1800 and loses 200 s; it resumes when a ends (3000), restarts for
    # 300 s and runs its last 2200 s: done at 5500.
    assert m["avg_jct_h"] * 3600 == pytest.approx((5500 + 1000) / 2)
    assert m["avg_beyond_h"] * 3600 == pytest.approx((1000 + 200 + 300) / 2)
    assert m["utilisation"] == pytest.approx(1.0)
    assert m["p95_queueing_h"] * 3600 == pytest.approx(0.95 * 1000)
    # b's only wait is after its preemption (2000 to 3000).
    assert m["max_queueing_h"] * 3600 == pytest.approx(1000)
    assert m["max_wait_h"] * 3600 == pytest.approx(1000)


def test_max_queueing_adds_up_a_jobs_waits_and_max_wait_is_its_longest():
    # b borrows the node, is reclaimed by a (waits 2000-3000), then by c (waits 3300-4300).
    trace = [
        TraceJob("b", 0, 8, 4000, "borrower"),
        TraceJob("a", 2000, 8, 1000, "owner"),
        TraceJob("c", 3300, 8, 1000, "owner"),
    ]
    queues = (Queue("borrower", "shared", "t", 0), Queue("owner", "shared", "t", 8))
    policy = functools.partial(
        schedule, config=PolicyConfig(reclaim_after_s=0, max_victim_loss_s=None, min_runtime_s=0)
    )
    m = simulate(trace, policy, nodes=1, gpus_per_node=8, queues=queues, window_s=0).metrics
    assert m["preemptions"] == 2
    assert m["max_queueing_h"] * 3600 == pytest.approx(2000)
    assert m["max_wait_h"] * 3600 == pytest.approx(1000)


def test_the_policy_is_never_shown_a_duration():
    assert not any("duration" in name for name in JobView.__dataclass_fields__)


def random_trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 120)
        gpus = rng.choice([1, 1, 1, 1, 2, 4, 8, 16])
        out.append(TraceJob(f"j{i}", round(t), gpus, rng.randint(700, 20_000), f"t{rng.randint(0, 3)}"))
    return out


@pytest.mark.parametrize("policy", [fifo, fifo_backfill, schedule])
def test_every_pass_of_a_replay_is_safe_and_every_job_ends(policy):
    trace = random_trace(300, seed=3)
    res = simulate(trace, policy, nodes=4, gpus_per_node=8, window_s=0, check=check)
    assert res.notes == []
    assert res.jobs == 300
    assert res.metrics["mean_slowdown"] >= 1.0


def test_jain_index():
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_command_line_prints_the_same_numbers_as_json(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    rows = ["job_id,submit_time,num_gpus,duration,tenant"] + [
        f"{j.id},{j.submit:.0f},{j.gpus},{j.duration:.0f},{j.tenant}" for j in random_trace(60, seed=5)
    ]
    path.write_text("\n".join(rows) + "\n")
    assert main(["--trace", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"fifo", "fifo_backfill", "ours"}
    assert out["tenant"].startswith("source cluster")
    assert main(["--trace", str(path), "--policies", "ours"]) == 0
    table = capsys.readouterr().out
    assert "tenant = source cluster" in table and "mean slowdown" in table


@pytest.mark.parametrize("shrink", [False, True])
def test_an_elastic_job_gives_engines_back_instead_of_being_preempted(shrink):
    # b (8 GPUs: an RL job of a 4-GPU trainer and 4 engines, --elastic) borrows the node; the owner's 2-GPU
    # job a arrives at 2000. Rigid: b is preempted (as above: done at 5500). Elastic: 2 of b's engines go,
    # b runs at 6/8 speed until a ends at 3000, gets them back, and ends at 2000 + 750 + 1250 = 4250.
    trace = [TraceJob("b", 0, 8, 4000, "borrower"), TraceJob("a", 2000, 2, 1000, "owner")]
    queues = (Queue("borrower", "shared", "t", 0), Queue("owner", "shared", "t", 8))
    config = PolicyConfig(reclaim_after_s=0, elastic_shrink=shrink, elastic_grow=shrink)
    res = simulate(
        trace,
        functools.partial(schedule, config=config),
        nodes=1,
        gpus_per_node=8,
        queues=queues,
        check=check,
        elastic=True,
    )
    m = res.metrics
    assert not res.notes
    assert (m["preemptions"], m["shrinks"], m["engines_back"]) == ((0, 1, 2) if shrink else (1, 0, 0))
    assert m["grows"] == (1 if shrink else 0)
    assert m["avg_jct_h"] * 3600 == pytest.approx(((4250 if shrink else 5500) + 1000) / 2)
