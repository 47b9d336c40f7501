"""Admin API: pools, nodes, queues, priority classes; cordon, drain and lost nodes (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from scheduler.dispatch import TASK_STOP, CeleryDispatcher, pool_queue
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.lifecycle import JobLifecycle
from tests.factories import drain_queue, grpo_spec, make_job


@pytest.fixture
def admin(api):  # type: ignore[no-untyped-def]
    client, settings, broker = api
    return client, settings, broker, client.app.state.db


def _team_pool_queue(client: TestClient) -> None:
    assert client.post("/v1/teams", json={"name": "math"}).status_code == 201
    r = client.post(
        "/v1/pools",
        json={
            "name": "h200",
            "accelerator": "h200",
            "ray_address": "http://127.0.0.1:9",
            "nodes": [{"name": "n1", "gpus": 8}, {"name": "n2", "gpus": 8}],
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["total_gpus"] == 16
    r = client.post(
        "/v1/queues",
        json={
            "name": "math-h200",
            "pool": "h200",
            "team": "math",
            "nominal_gpus": 16,
            "borrowing_limit": 0,
            "weight": 2,
        },
    )
    assert r.status_code == 201, r.text


def test_admin_objects_and_their_errors(admin) -> None:  # type: ignore[no-untyped-def]
    client, *_ = admin
    _team_pool_queue(client)
    again = {
        "/v1/pools": {"name": "h200", "accelerator": "h200"},
        "/v1/teams": {"name": "math"},
        "/v1/queues": {"name": "math-h200", "pool": "h200", "team": "math", "nominal_gpus": 1},
        "/v1/priority-classes": {"name": "high", "value": 1, "preemptible": True},
    }
    codes = {path: client.post(path, json=body) for path, body in again.items()}
    assert {p: (r.status_code, r.json()["error"]["code"]) for p, r in codes.items()} == {
        "/v1/pools": (409, "pool.exists"),
        "/v1/teams": (409, "team.exists"),
        "/v1/queues": (409, "queue.exists"),
        "/v1/priority-classes": (409, "priority_class.exists"),
    }
    bad = client.post("/v1/queues", json={"name": "q2", "pool": "h200", "team": "math", "nominal_gpus": -1})
    assert bad.status_code == 422 and bad.json()["error"]["details"]["issues"][0]["field"] == "nominal_gpus"
    assert (
        client.post(
            "/v1/queues", json={"name": "q3", "pool": "nope", "team": "math", "nominal_gpus": 1}
        ).status_code
        == 404
    )
    queues = {q["name"]: q for q in client.get("/v1/queues").json()["data"]}
    assert queues["math-h200"]["nominal_gpus"] == 16 and queues["math-h200"]["weight"] == 2
    assert client.patch("/v1/queues/math-h200", json={"nominal_gpus": 8}).json()["nominal_gpus"] == 8
    classes = {p["name"]: p for p in client.get("/v1/priority-classes").json()["data"]}
    assert classes["high"]["preemptible"] is False and classes["low"]["value"] < classes["normal"]["value"]
    r = client.post("/v1/priority-classes", json={"name": "urgent", "value": 500, "preemptible": False})
    assert r.status_code == 201
    # a member key cannot administer
    key = client.post("/v1/api-keys", json={"name": "m", "role": "member", "team": "math"}).json()["key"]
    r = client.post("/v1/teams", json={"name": "x"}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 403


def test_priority_class_of_a_job(admin) -> None:  # type: ignore[no-untyped-def]
    client, *_ = admin
    job = client.post("/v1/jobs", json={"spec": grpo_spec(), "priority_class": "high"}).json()
    assert (job["priority_class"], job["priority"], job["preemptible"]) == ("high", 100, False)
    r = client.post("/v1/jobs", json={"spec": grpo_spec(), "priority_class": "vip"})
    assert r.status_code == 422 and "normal" in r.json()["error"]["details"]["issues"][0]["hint"]


def test_cordon_drain_and_node_down(admin) -> None:  # type: ignore[no-untyped-def]
    client, settings, broker, db = admin
    _team_pool_queue(client)
    # 8-GPU jobs: the CPU backend refuses them at submission, so they are stored directly
    a = {"id": make_job(db, queue="math-h200", gpus_per_replica=8)}
    b = {"id": make_job(db, queue="math-h200", gpus_per_replica=8)}
    client.patch("/v1/pools/h200/nodes/n2", json={"cordoned": True})
    dispatcher = CeleryDispatcher(broker)
    run_scheduling_pass(db, dispatcher)
    jobs = {j: client.get(f"/v1/jobs/{j}").json() for j in (a["id"], b["id"])}
    assert jobs[a["id"]]["status"] == "ADMITTED" and jobs[a["id"]]["allocations"][0]["node"] == "n1"
    assert jobs[b["id"]]["status"] == "QUEUED"  # n2 is cordoned
    # pools show who holds each node's GPUs; queues show use against quota and what waits
    h200 = next(p for p in client.get("/v1/pools").json()["data"] if p["name"] == "h200")
    assert {n["name"]: n["jobs"] for n in h200["nodes"]} == {"n1": [{"job_id": a["id"], "gpus": 8}], "n2": []}
    q = next(q for q in client.get("/v1/queues").json()["data"] if q["name"] == "math-h200")
    assert (q["used_gpus"], q["running_jobs"], q["queued_jobs"], q["queued_gpus"]) == (8, 1, 1, 8)
    assert q["borrowed_gpus"] == max(0, 8 - q["nominal_gpus"])
    client.patch("/v1/pools/h200/nodes/n2", json={"cordoned": False})
    run_scheduling_pass(db, dispatcher)
    assert client.get(f"/v1/jobs/{b['id']}").json()["allocations"][0]["node"] == "n2"
    # a has started; draining n1 asks it to checkpoint and requeue
    with db.session() as s:
        JobLifecycle(s).transition(a["id"], "STARTING", expected_from="ADMITTED", reason="test")
    r = client.post("/v1/pools/h200/nodes/n1/drain").json()
    assert r["requeued"] == {a["id"]: "PREEMPTING"}
    h200 = next(p for p in client.get("/v1/pools").json()["data"] if p["name"] == "h200")
    assert h200["nodes"][0]["cordoned"] is True
    # n2 is lost: b (ADMITTED, not launched) goes straight back to the queue
    r = client.patch("/v1/pools/h200/nodes/n2", json={"alive": False}).json()
    assert r["requeued"] == {b["id"]: "QUEUED"}
    got = client.get(f"/v1/jobs/{b['id']}").json()
    assert got["status"] == "QUEUED" and got["allocations"] == [] and "down" in got["status_reason"]
    drain_queue(broker, pool_queue("h200"))
    # a preempted job that had started gets its Ray job stopped at once when its node dies
    with db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(a["id"], "QUEUED", expected_from="PREEMPTING", reason="test")
    client.patch("/v1/pools/h200/nodes/n1", json={"cordoned": False})
    client.patch("/v1/pools/h200/nodes/n2", json={"alive": True})
    run_scheduling_pass(db, dispatcher)
    node_of_a = client.get(f"/v1/jobs/{a['id']}").json()["allocations"][0]["node"]
    with db.session() as s:
        JobLifecycle(s).transition(a["id"], "STARTING", expected_from="ADMITTED", reason="test")
    drain_queue(broker, pool_queue("h200"))
    r = client.patch(f"/v1/pools/h200/nodes/{node_of_a}", json={"alive": False}).json()
    assert r["requeued"] == {a["id"]: "PREEMPTING"}
    assert (TASK_STOP, [a["id"]]) in drain_queue(broker, pool_queue("h200"))
