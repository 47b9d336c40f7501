"""`--use-health-check` on a real Ray cluster of three nodes on this machine (the head with the trainer's one
slot, two workers of two slots) with real engine servers (the tiny model, CPU): an engine whose server is
SIGSTOPped (hung) and one whose actor is SIGKILLed (dead) are replaced mid-run with the current weights, their
requests generated again elsewhere; then the node holding both engines is removed, Ray moves the engines'
placement-group bundles to the other worker, and the health check replaces both there with the current
weights. The run finishes every step with complete batches and still learns.

(The faults were two runs: the hung and dead engines on the local Ray of tests/ray/conftest.py, the lost node
here. One run for all three saves a trainer and two engine servers to start, ~30 s of CPU; the faults come
one after the other, the node only once both earlier replacements serve.)"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray.conftest import read_metrics, read_reports
from tests.ray.test_rollout_health import (
    Faults,
    engine_servers,
    health_spec,
    launcher_pid,
    no_stray_servers,  # noqa: F401 - a fixture
    run_job,
    steps_done,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    # Ray marks a node whose raylet stopped answering dead after `health_check_failure_threshold` checks
    # `health_check_period_ms` apart (default 5 x 3 s): 3 x 1 s here, so the lost node's placement-group bundles
    # move ~10 s sooner (a check still waits up to its 10 s timeout for a busy raylet before it counts as failed)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="WARNING")
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def rollout_nodes() -> set[str]:
    """The nodes the job's rollout placement group (the one of two bundles) holds now."""
    import ray

    nodes: set[str] = set()
    for table in ray.util.placement_group_table().values():
        if table.get("state") == "CREATED" and len(table.get("bundles") or {}) == 2:
            nodes |= {str(n) for n in (table.get("bundles_to_node_id") or {}).values()}
    return nodes


def latest_step_metrics(out: Path) -> dict[str, float]:
    """The newest step's metrics the driver has written so far (a line still being written is skipped)."""
    path = out / "report" / "metrics.jsonl"
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.setdefault(row["step"], {})[row["name"]] = row["value"]
    return rows[max(rows)] if rows else {}


def both_replaced(out: Path) -> bool:
    latest = latest_step_metrics(out)
    return latest.get("rollout/engine_replacements") == 2 and latest.get("rollout/healthy_engines") == 2


@pytest.mark.usefixtures("no_stray_servers")
def test_hung_dead_and_lost_engines_are_replaced_and_the_run_learns(
    three_nodes: Any, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    state: dict[str, Any] = {}

    def stop_one() -> str:  # a hung engine: its server process stopped, its actor alive
        server = min(engine_servers(tmp_path.parent), key=lambda p: p.pid)
        server.send_signal(signal.SIGSTOP)
        faults.stopped.append(server)
        state["stopped"] = server
        return f"SIGSTOP server {server.pid}"

    def kill_another() -> str:  # a dead engine: its actor SIGKILLed (its server follows it)
        others = [p for p in engine_servers(tmp_path.parent) if p.pid != state["stopped"].pid]
        actor = launcher_pid(min(others, key=lambda p: p.pid))
        os.kill(actor, signal.SIGKILL)
        return f"SIGKILL actor {actor}"

    def remove_engines_node() -> str:  # both engines (the replacements) lost with their node
        (node_id,) = rollout_nodes()
        (node,) = [n for n in three_nodes.worker_nodes if n.node_id == node_id]
        three_nodes.remove_node(node, allow_graceful=False)
        state["lost"] = node_id
        return f"removed node {node_id}"

    # the second fault while the first engine is still being replaced: for a while no engine is healthy,
    # and the step waits for a replacement (never for the dead); the node once both replacements serve
    plan = [
        (lambda out: steps_done(out) >= 2, stop_one),
        (lambda out: steps_done(out) >= 4, kill_another),
        (both_replaced, remove_engines_node),
    ]
    spec = health_spec(artifacts, tmp_path, **{"max-global-restart": 4})
    with Faults(tmp_path, plan) as faults:
        began = time.monotonic()
        code = run_job(spec, tmp_path, "health")
        took = time.monotonic() - began
    assert faults.error is None, faults.error
    assert code == 0
    assert len(faults.done) == 3, faults.done

    metrics = read_metrics(tmp_path / "report")
    steps = range(30)
    replacements = [metrics["rollout/engine_replacements"][s] for s in steps]
    assert replacements[:2] == [0, 0] and replacements[-1] == 4, replacements
    assert replacements == sorted(replacements)
    healthy = [metrics["rollout/healthy_engines"][s] for s in steps]
    assert healthy[0] == 2 and healthy[-1] == 2 and min(healthy) < 2, healthy
    # every step's batch is whole: 16 prompts x 8 samples, each prompt exactly 8 times
    for step in steps:
        rows = [
            json.loads(line)
            for line in (tmp_path / "ckpt" / "rollout_result" / "train" / f"{step}.jsonl")
            .read_text()
            .splitlines()
        ]
        per_prompt = collections.Counter(row["prompt"] for row in rows)
        assert len(rows) == 128 and set(per_prompt.values()) == {8}, (step, len(rows), per_prompt)
    # the replacements took the current weights: engine and trainer agree on every step's log-probs
    assert max(metrics["rollout/logprob_abs_diff"].values()) < 1e-3
    assert [metrics["rollout/weight_version"][s] for s in steps] == list(steps)
    reward = [metrics["rollout/reward"][s] for s in steps]
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert last > first + 0.1, f"reward did not rise: first {first:.3f} last {last:.3f}"
    logs = [item["message"] for r in read_reports(tmp_path / "report") for item in r.get("logs", [])]
    replaced = [m for m in logs if m.startswith("rollout engine") and "replaced in" in m]
    assert len(replaced) == 4 and all("placement-group bundle" in m for m in replaced), replaced
    # the lost node's bundles moved: the engines serve from the other worker
    assert state["lost"] not in rollout_nodes()
    print(f"faulted run: {took:.1f} s, faults {faults.done}, reward {first:.3f} -> {last:.3f}")
