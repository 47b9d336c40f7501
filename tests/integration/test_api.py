"""The HTTP API through the app, against real SQLite and PostgreSQL, with the real dispatcher."""

from __future__ import annotations

import pytest

from scheduler.dispatch import TASK_PASS
from scheduler.services.auth import job_token
from tests.factories import drain_queue, grpo_spec


def test_requests_without_a_key_are_refused(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.get("/v1/jobs", headers={"Authorization": ""})
    assert r.status_code == 401
    body = r.json()["error"]
    assert body["code"] == "unauthenticated" and body["request_id"]


def test_submit_as_object_and_as_flags(api) -> None:  # type: ignore[no-untyped-def]
    client, _, broker = api
    r = client.post("/v1/jobs", json={"name": "as-object", "spec": grpo_spec()})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "QUEUED" and job["spec"]["n_samples_per_prompt"] == 4
    args = [
        "--train-backend",
        "torch",
        "--hf-checkpoint",
        "/models/tiny",
        "--prompt-data",
        "/data/train.jsonl",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "16",
        "--colocate",
        "--resource",
        '{"actor": [1, 1], "rollout": [1, 1]}',
        "--num-rollout",
        "2",
    ]
    r = client.post("/v1/jobs", json={"name": "as-flags", "args": args})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["colocate"] is True
    assert r.json()["submitted"]["args"] == args
    # each submission asked for a scheduling pass, after its commit
    assert [t for t, _ in drain_queue(broker, "scheduler")] == [TASK_PASS, TASK_PASS]
    listed = client.get("/v1/jobs").json()["data"]
    assert [j["name"] for j in listed] == ["as-flags", "as-object"]


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"rollout-batch-size": "eight"}, "rollout-batch-size"),
        ({"rollout-batch-sise": 8}, "rollout-batch-sise"),
        ({"lr": [1]}, "lr"),
    ],
)
def test_bad_spec_is_422_naming_the_field_and_stores_nothing(api, spec, field) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**spec)})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "spec.invalid"
    assert field in err["message"]
    assert any(i["field"] == field and i["hint"] for i in err["details"]["issues"])
    assert client.get("/v1/jobs").json()["data"] == []


def test_unknown_request_field_is_422(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec(), "colour": "blue"})
    assert r.status_code == 422
    assert r.json()["error"]["details"]["issues"][0]["field"] == "colour"


def test_validate_is_a_dry_run(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/specs/validate", json={"spec": grpo_spec()})
    assert r.status_code == 200
    body = r.json()
    assert body["valid"] and body["pool"] == "local" and body["demand"]["total_gpus"] >= 1
    assert "--rollout-batch-size" in body["argv"]
    bad = client.post(
        "/v1/specs/validate", json={"spec": grpo_spec(**{"kl-coef": 0.1, "kl-loss-coef": 0.1})}
    ).json()
    assert not bad["valid"] and bad["errors"]
    assert client.get("/v1/jobs").json()["data"] == []


def test_job_references_resolve_to_the_producers_outputs(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**{"hf-checkpoint": "job://sft-x/hf"})})
    assert r.status_code == 422
    assert r.json()["error"]["details"]["issues"][0]["code"] == "spec.unknown_job_reference"
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**{"hf-checkpoint": "artifacts://models/none"})})
    assert r.json()["error"]["details"]["issues"][0]["code"] == "spec.missing_input"


def test_driver_reports_flow_to_the_read_endpoints(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, broker = api
    from scheduler.services.jobs import JobService

    job = client.post("/v1/jobs", json={"spec": grpo_spec(save="ckpt")}).json()
    # the scheduler and a worker would do this; here through the same service the worker uses
    db = client.app.state.db
    with db.session() as s:
        svc = JobService(s, artifact_root=settings.artifacts)
        svc.transition(job["id"], "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job["id"], "STARTING", expected_from="ADMITTED", reason="test")
    token = job_token(settings.signing_key(), job["id"], 1)
    h = {"Authorization": f"Bearer {token}"}
    spec = client.get(f"/v1/internal/jobs/{job['id']}/spec", headers=h)
    assert spec.status_code == 200 and spec.json()["spec"]["rollout_batch_size"] == 4
    assert (
        client.get(
            f"/v1/internal/jobs/{job['id']}/spec", headers={"Authorization": "Bearer rjt_wrong"}
        ).status_code
        == 401
    )
    report = {
        "attempt": 1,
        "seq": 0,
        "phase": "running",
        "progress": {"step": 1, "total_steps": 3},
        "metrics": [
            {"step": 1, "name": n, "value": v, "time": 1e9}
            for n, v in (("rollout/reward", 0.1), ("train/loss", 2.0), ("perf/step_time", 1.5))
        ],
        "logs": [{"time": 1e9, "level": "INFO", "source": "driver", "message": "step 1 done"}],
        "checkpoints": [
            {"step": 1, "path": "/x/iter_0000001", "size_bytes": 123, "format": "torch", "time": 1e9}
        ],
        "rollouts": [
            {"rollout_id": 1, "split": "train", "path": "/x/rollout_result/train/1.jsonl", "num_samples": 16}
        ],
        "events": [{"time": 1e9, "kind": "model_loaded", "message": "tiny"}],
    }
    r = client.post(f"/v1/internal/jobs/{job['id']}/report", json=report, headers=h)
    assert r.status_code == 200 and r.json() == {"stop_requested": False}
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert got["status"] == "RUNNING" and got["progress_step"] == 1
    series = client.get(f"/v1/jobs/{job['id']}/metrics").json()["series"]
    assert set(series) == {"rollout/reward", "train/loss", "perf/step_time"}
    only = client.get(f"/v1/jobs/{job['id']}/metrics", params={"names": "train/loss"}).json()["series"]
    assert list(only) == ["train/loss"]
    logs = client.get(f"/v1/jobs/{job['id']}/logs").json()
    assert logs["data"][0]["message"] == "step 1 done"
    assert client.get(f"/v1/jobs/{job['id']}/logs", params={"after": logs["next_after"]}).json()["data"] == []
    ck = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert ck[0]["step"] == 1 and ck[0]["size_bytes"] == 123
    assert client.get(f"/v1/jobs/{job['id']}/rollouts").json()["data"][0]["num_samples"] == 16
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    assert [e["to_status"] for e in events if e["kind"] == "transition"] == [
        "QUEUED",
        "ADMITTED",
        "STARTING",
        "RUNNING",
    ]
    assert all(e["time"] and e["reason"] for e in events)
    # cancel: the driver is told to stop on its next report
    assert client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "CANCELLING"
    r = client.post(f"/v1/internal/jobs/{job['id']}/report", json={"attempt": 1, "seq": 1}, headers=h)
    assert r.json() == {"stop_requested": True}


def test_stream_ends_with_the_job(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    kinds = []
    with client.stream("GET", f"/v1/jobs/{job['id']}/stream") as r:
        for line in r.iter_lines():
            if line.startswith("event:"):
                kinds.append(line.split(":", 1)[1].strip())
    assert kinds[0] == "status" and "event" in kinds and kinds[-1] == "end"


def test_pools_queues_health_and_prometheus(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    pools = client.get("/v1/pools").json()["data"]
    assert pools[0]["name"] == "local" and pools[0]["nodes"][0]["gpus"] == 2
    assert client.get("/v1/queues").json()["data"][0]["name"] == "default"
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert "relax_pool_gpus" in client.get("/metrics").text
    assert client.get("/openapi.json").json()["paths"]["/v1/jobs"]


def test_stream_resumes_from_last_event_id_and_logs_tail(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    from scheduler.services.jobs import JobService

    job = client.post("/v1/jobs", json={"name": "streamed-job", "spec": grpo_spec()}).json()
    with client.app.state.db.session() as s:
        svc = JobService(s, artifact_root=settings.artifacts)
        svc.transition(job["id"], "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job["id"], "STARTING", expected_from="ADMITTED", reason="test")
    h = {"Authorization": f"Bearer {job_token(settings.signing_key(), job['id'], 1)}"}
    report = {
        "attempt": 1,
        "seq": 0,
        "phase": "running",
        "logs": [{"time": 1e9, "message": f"line {i}"} for i in range(5)],
        "predictions": [{"step": 2, "path": "/x/predict/predictions_step_2.jsonl", "num_samples": 3}],
    }
    assert client.post(f"/v1/internal/jobs/{job['id']}/report", json=report, headers=h).status_code == 200
    tail = client.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 2}).json()["data"]
    assert [line["message"] for line in tail] == ["line 3", "line 4"]
    assert client.get(f"/v1/jobs/{job['id']}/predictions").json()["data"][0]["step"] == 2
    assert [j["id"] for j in client.get("/v1/jobs", params={"name_contains": "eamed-j"}).json()["data"]] == [
        job["id"]
    ]
    client.post(f"/v1/jobs/{job['id']}/cancel")
    with client.app.state.db.session() as s:
        JobService(s, artifact_root=settings.artifacts).transition(
            job["id"], "CANCELLED", expected_from="CANCELLING", reason="test"
        )

    def read(headers: dict[str, str]) -> list[tuple[str, str]]:
        out, last_id, kind = [], None, None
        with client.stream("GET", f"/v1/jobs/{job['id']}/stream", headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("id:"):
                    last_id = line[3:].strip()
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    out.append((kind, last_id))
        return out

    first = read({})
    kinds = [k for k, _ in first]
    assert kinds.count("log") == 5 and "prediction" in kinds and kinds[-1] == "end"
    # Resuming from the last id replays nothing but the current status and the end.
    again = read({"Last-Event-ID": first[-1][1]})
    assert [k for k, _ in again] == ["status", "end"]


@pytest.mark.parametrize(
    "override,field",
    [
        ({"bf16": True}, "bf16"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"train-backend": "megatron"}, "train-backend"),
    ],
)
def test_parameters_the_backend_does_not_implement_are_refused_by_name(api, override, field) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**override)})
    assert r.status_code == 422, r.text
    issues = r.json()["error"]["details"]["issues"]
    assert any(i["code"] == "spec.unsupported_by_backend" and i["field"] == field for i in issues), issues
    assert field in r.json()["error"]["message"]
    assert client.get("/v1/jobs").json()["data"] == []
    dry = client.post("/v1/specs/validate", json={"spec": grpo_spec(**override)}).json()
    assert not dry["valid"] and any(e["field"] == field for e in dry["errors"])
