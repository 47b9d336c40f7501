"""The HTTP API through the app, against real SQLite and PostgreSQL, with the real dispatcher."""

from __future__ import annotations

import json

from scheduler.dispatch import TASK_PASS
from scheduler.services.job_tokens import bootstrap_secret
from tests.factories import drain_queue, grpo_spec


def test_requests_without_a_key_are_refused(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.get("/v1/jobs", headers={"Authorization": ""})
    assert r.status_code == 401
    body = r.json()["error"]
    assert body["code"] == "unauthenticated" and body["request_id"]


#: The tiny GRPO job of grpo_spec() as Relax flags.
TINY_ARGS = (
    *("--train-backend", "torch", "--hf-checkpoint", "artifacts://models/tiny"),
    *("--prompt-data", "artifacts://data/train.jsonl"),
    *("--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16"),
    *("--colocate", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}', "--num-rollout", "2"),
)


def test_submit_as_object_and_as_flags(api) -> None:  # type: ignore[no-untyped-def]
    client, _, broker = api
    r = client.post("/v1/jobs", json={"name": "as-object", "spec": grpo_spec()})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "QUEUED" and job["spec"]["n_samples_per_prompt"] == 4
    args = list(TINY_ARGS)
    r = client.post("/v1/jobs", json={"name": "as-flags", "args": args})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["colocate"] is True
    assert r.json()["submitted"]["args"] == args
    # each submission asked for a scheduling pass, after its commit
    assert [t for t, _ in drain_queue(broker, "scheduler")] == [TASK_PASS, TASK_PASS]
    listed = client.get("/v1/jobs").json()["data"]
    assert [j["name"] for j in listed] == ["as-flags", "as-object"]


def test_launch_script_provenance_is_kept_with_the_job(api) -> None:  # type: ignore[no-untyped-def]
    """relaxctl resolves a launch script on the client and sends its flags plus where they came
    from; the server stores that under `submitted.launch_script` and never runs it."""
    client, _, _ = api
    args = list(TINY_ARGS)
    script = {
        "path": "/home/me/relax/scripts/run-tiny.sh",
        "sha256": "a" * 64,
        "text": "#!/bin/bash\nexport WANDB_API_KEY=***\npython3 -m relax.entrypoints.train ...\n",
        "env": {"MODEL_DIR": "/models", "HF_TOKEN": "***"},
        "script_args": ["--num-rollout", "2"],
        "file": "/home/me/relax/scripts/run-tiny.sh",
        "line": 3,
        "entrypoint": "python3 -m relax.entrypoints.train",
        "launcher": "ray job submit",
        "runtime_env": {"env_vars": {"PYTHONPATH": "/root/Megatron-LM"}},
        "working_dir": None,
        "submission_id": "tiny-1",
    }
    dry = client.post("/v1/specs/validate", json={"args": args, "launch_script": script})
    assert dry.status_code == 200 and dry.json()["valid"], dry.text
    r = client.post("/v1/jobs", json={"name": "from-script", "args": args, "launch_script": script})
    assert r.status_code == 201, r.text
    kept = client.get(f"/v1/jobs/{r.json()['id']}").json()["submitted"]
    assert kept["args"] == args and kept["launch_script"] == script | {"text_truncated": False}
    # a launch script comes with the flags resolved from it; its size and keys are bounded
    for bad in (
        {"spec": grpo_spec(), "launch_script": script},
        {"args": args, "launch_script": script | {"text": "#" * (256 * 1024 + 1)}},
        {"args": args, "launch_script": script | {"shell": "rm -rf /"}},
        {"args": args, "launch_script": script | {"sha256": "not-a-digest"}},
    ):
        assert client.post("/v1/jobs", json=bad).status_code == 422
    assert [j["name"] for j in client.get("/v1/jobs").json()["data"]] == ["from-script"]


def test_relaxctl_submits_a_launch_script(api, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`relaxctl submit SCRIPT.sh --env … -- args` through the SDK to the real app."""
    from typer.testing import CliRunner

    import client.cli as cli
    import client.commands as commands
    from client.sdk import RelaxClient

    client, _, _ = api
    script = tmp_path / "run-tiny-grpo.sh"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        "pkill -9 python || true\n"
        "ROLLOUT_ARGS=(--rollout-batch-size 4 --n-samples-per-prompt 4 --global-batch-size 16)\n"
        'ray job submit --runtime-env-json=\'{"env_vars": {"HF_TOKEN": "secret"}}\' -- '
        "python3 -m relax.entrypoints.train --train-backend torch \\\n"
        '  --hf-checkpoint "${MODEL_DIR}/tiny" --prompt-data artifacts://data/train.jsonl "${ROLLOUT_ARGS[@]}" \\\n'
        '  --colocate --resource \'{"actor": [1, 1], "rollout": [1, 1]}\' "$@"\n'
    )

    def sdk(url, key):  # type: ignore[no-untyped-def]
        c = RelaxClient("http://testserver", "unused")
        c._http = client
        c.close = lambda: None  # type: ignore[method-assign]  # the fixture closes the test client
        return c

    monkeypatch.setattr(commands, "connect", sdk)
    r = CliRunner().invoke(
        cli.app,
        [
            "submit",
            str(script),
            "--env",
            "MODEL_DIR=artifacts://models",
            "--json",
            "--",
            "--num-rollout",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    job = client.get(f"/v1/jobs/{json.loads(r.output)['id']}").json()
    assert job["name"] == "run-tiny-grpo" and job["spec"]["num_rollout"] == 2
    kept = job["submitted"]["launch_script"]
    assert (kept["line"], kept["launcher"], kept["script_args"]) == (
        5,
        "ray job submit",
        ["--num-rollout", "2"],
    )
    assert kept["env"] == {"MODEL_DIR": "artifacts://models"} and kept["runtime_env"] == {
        "env_vars": {"HF_TOKEN": "***"}
    }
    assert job["submitted"]["args"][:4] == [
        "--train-backend",
        "torch",
        "--hf-checkpoint",
        "artifacts://models/tiny",
    ]


# (what a spec sets wrongly, the field its error names)
BAD_SPECS = [
    ({"rollout-batch-size": "eight"}, "rollout-batch-size"),
    ({"rollout-batch-sise": 8}, "rollout-batch-sise"),
    ({"lr": [1]}, "lr"),
]


def test_bad_spec_is_422_naming_the_field_and_stores_nothing(api, subtests) -> None:  # type: ignore[no-untyped-def]
    """Each of BAD_SPECS a subtest, one after another on one platform: each stores nothing."""
    client, _, _ = api
    for spec, field in BAD_SPECS:
        with subtests.test(field=field):
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


def _driver_headers(client, settings, job_id: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """What the driver does first: exchange attempt 1's bootstrap secret for the attempt's token."""
    secret = bootstrap_secret(settings.signing_key(), job_id, 1)
    r = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def test_driver_reports_flow_to_the_read_endpoints(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, broker = api
    from scheduler.services.lifecycle import JobLifecycle

    job = client.post("/v1/jobs", json={"spec": grpo_spec(save="ckpt")}).json()
    # the scheduler and a worker would do this; here through the same service the worker uses
    db = client.app.state.db
    with db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job["id"], "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job["id"], "STARTING", expected_from="ADMITTED", reason="test")
    h = _driver_headers(client, settings, job["id"])
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
    from scheduler.services.lifecycle import JobLifecycle

    job = client.post("/v1/jobs", json={"name": "streamed-job", "spec": grpo_spec()}).json()
    with client.app.state.db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job["id"], "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job["id"], "STARTING", expected_from="ADMITTED", reason="test")
    h = _driver_headers(client, settings, job["id"])
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
        JobLifecycle(s).transition(job["id"], "CANCELLED", expected_from="CANCELLING", reason="test")

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
    # Resuming from the last id replays nothing: the status it names is the job's still; then the end.
    again = read({"Last-Event-ID": first[-1][1]})
    assert [k for k, _ in again] == ["end"]


# (what a spec sets, the parameter its backend does not implement)
UNIMPLEMENTED = [
    ({"bf16": True}, "bf16"),
    ({"optimizer": "sgd"}, "optimizer"),
    # the megatron backend runs now; a parameter no backend implements is refused by name
    ({"train-backend": "megatron", "checkpoint-engine-backend": "ipc"}, "checkpoint-engine-backend"),
]


def test_parameters_the_backend_does_not_implement_are_refused_by_name(api, subtests) -> None:  # type: ignore[no-untyped-def]
    """Each of UNIMPLEMENTED a subtest, one after another on one platform: each stores nothing."""
    client, _, _ = api
    for override, field in UNIMPLEMENTED:
        with subtests.test(field=field):
            r = client.post("/v1/jobs", json={"spec": grpo_spec(**override)})
            assert r.status_code == 422, r.text
            issues = r.json()["error"]["details"]["issues"]
            assert any(i["code"] == "spec.unsupported_by_backend" and i["field"] == field for i in issues), (
                issues
            )
            assert field in r.json()["error"]["message"]
            assert client.get("/v1/jobs").json()["data"] == []
            dry = client.post("/v1/specs/validate", json={"spec": grpo_spec(**override)}).json()
            assert not dry["valid"] and any(e["field"] == field for e in dry["errors"])


def test_a_relax_ppo_spec_is_valid_without_rollout_logprobs(api) -> None:  # type: ignore[no-untyped-def]
    """Relax's PPO scripts do not pass --use-rollout-logprobs: both backends recompute the old log-probs with
    the trainer, so the spec is accepted as written (and with the flag). A critic on two devices is two
    megatron-core ranks; the torch backend's critic is one process, and it refuses that by name."""
    client, _, _ = api
    resource = {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 1], "advantages": [1, 0]}
    ppo = grpo_spec(**{"advantage-estimator": "ppo", "resource": resource})
    for spec in (ppo, {**ppo, "use-rollout-logprobs": True}):
        dry = client.post("/v1/specs/validate", json={"spec": spec}).json()
        assert dry["valid"] and not dry["errors"], dry["errors"]
    # (3 GPUs: more than the test pool holds, job.unschedulable, which is not the point here)
    two = {**ppo, "resource": {**resource, "critic": [1, 2]}}

    def refused(spec: dict) -> list[str]:
        dry = client.post("/v1/specs/validate", json={"spec": spec}).json()
        return [e["field"] for e in dry["errors"] if e["code"] == "spec.unsupported_by_backend"]

    assert refused(two) == ["resource"]
    assert refused({**two, "train-backend": "megatron"}) == []


VALIDATION_KEYS = {
    "valid",
    "spec",
    "argv",
    "derived",
    "demand",
    "capacity",
    "warnings",
    "errors",
    "queue",
    "pool",
}


def _severities(answer: dict) -> tuple[set, set]:
    return {i.get("severity") for i in answer["errors"]}, {i.get("severity") for i in answer["warnings"]}


def test_validate_answer_has_every_key_and_keeps_warnings_apart(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    ok = client.post("/v1/specs/validate", json={"spec": grpo_spec(**{"max-actor-ckpt-to-keep": 3})}).json()
    assert set(ok) == VALIDATION_KEYS and ok["valid"]
    assert ok["spec"] and ok["argv"] and ok["demand"] and ok["capacity"]["pool"]["fits"] is True
    assert [w["code"] for w in ok["warnings"]] == ["rule.max_actor_ckpt_to_keep_needs_save"]
    # An error and a warning: each under its own key, and what was understood is still shown.
    bad = grpo_spec(**{"max-actor-ckpt-to-keep": 3, "global-batch-size": 12})
    r = client.post("/v1/specs/validate", json={"spec": bad}).json()
    assert set(r) == VALIDATION_KEYS and not r["valid"]
    assert _severities(r) == ({"error"}, {"warning"})
    assert [e["code"] for e in r["errors"]] == ["rule.global_batch_size_divides_rollout"]
    assert [w["code"] for w in r["warnings"]] == ["rule.max_actor_ckpt_to_keep_needs_save"]
    assert r["spec"]["global_batch_size"] == 12 and "--global-batch-size" in r["argv"]
    assert r["demand"]["total_gpus"] == 1
    # Refused by the backend: the refusal is an error, the spec's warnings stay warnings.
    refused = client.post(
        "/v1/specs/validate", json={"spec": grpo_spec(**{"optimizer": "sgd", "max-actor-ckpt-to-keep": 3})}
    ).json()
    assert set(refused) == VALIDATION_KEYS and not refused["valid"]
    assert _severities(refused) == ({"error"}, {"warning"})
    assert [e["field"] for e in refused["errors"]] == ["optimizer"]
    # Flags with a value that cannot be read: the flags that were understood come back as argv.
    args = ["--train-backend", "torch", "--hf-checkpoint", "/models/tiny", "--rollout-batch-size", "eight"]
    flags = client.post("/v1/specs/validate", json={"args": args}).json()
    assert set(flags) == VALIDATION_KEYS and not flags["valid"]
    assert "--hf-checkpoint" in flags["argv"] and "eight" not in flags["argv"]
    assert flags["spec"]["hf_checkpoint"] == "/models/tiny"
    # Not even a spec: every key is still there.
    neither = client.post("/v1/specs/validate", json={}).json()
    assert set(neither) == VALIDATION_KEYS and not neither["valid"] and neither["errors"]
    assert neither["spec"] is None and neither["argv"] is None and neither["warnings"] == []


# (request body, the one field it is wrong in): each gets one error, naming that field
ONE_MISTAKE = [
    ({"spec": grpo_spec(**{"rollout-batch-size": "eight"})}, "rollout-batch-size"),
    (
        {"spec": {**grpo_spec(**{"rollout-batch-size": None}), "rollout-batch-sise": 4}},
        "rollout-batch-sise",
    ),
    ({"spec": grpo_spec(**{"num-rollout": "many"})}, "num-rollout"),
    ({"spec": grpo_spec(**{"resource": "{not json"})}, "resource"),
    (
        {
            "args": [
                "--train-backend",
                "torch",
                "--hf-checkpoint",
                "/models/tiny",
                "--prompt-data",
                "/data/train.jsonl",
                "--num-rollout",
                "2",
                "--colocate",
                "--resource",
                '{"actor": [1, 1], "rollout": [1, 1]}',
                "--rollout-batch-size",
                "eight",
            ]
        },
        "rollout-batch-size",
    ),
]


def test_one_mistake_gives_one_error(api, subtests) -> None:  # type: ignore[no-untyped-def]
    """A bad value is not also reported as missing, nor a misspelt key's field as required. Each of ONE_MISTAKE
    a subtest, one after another on one platform (a refused body stores no job)."""
    client, _, _ = api
    for request_body, field in ONE_MISTAKE:
        with subtests.test(field=field, body=sorted(request_body)):
            if "spec" in request_body:
                request_body = {"spec": {k: v for k, v in request_body["spec"].items() if v is not None}}
            answer = client.post("/v1/specs/validate", json=request_body).json()
            assert [e["field"] for e in answer["errors"]] == [field], answer["errors"]
            assert not any(w["field"] == field for w in answer["warnings"]), answer["warnings"]
            r = client.post("/v1/jobs", json=request_body)
            assert r.status_code == 422
            issues = r.json()["error"]["details"]["issues"]
            assert [i["field"] for i in issues if i["severity"] == "error"] == [field]
    assert client.get("/v1/jobs").json()["data"] == []


def test_the_default_backend_is_megatron_and_it_runs(api) -> None:  # type: ignore[no-untyped-def]
    """Relax's default backend (a spec without --train-backend) is megatron, which the platform runs."""
    client, _, _ = api
    spec = {k: v for k, v in grpo_spec(**{"bf16": True}).items() if k != "train-backend"}
    answer = client.post("/v1/specs/validate", json={"spec": spec}).json()
    assert answer["valid"] and not answer["errors"], answer["errors"]
    # The megatron backend's own derived values are shown.
    assert answer["derived"]["use_distributed_optimizer"] is True
    broken = {**spec, "global-batch-size": 12}
    answer = client.post("/v1/specs/validate", json={"spec": broken}).json()
    assert [e["field"] for e in answer["errors"]] == ["global-batch-size"]
    # A parameter it does not implement is refused by name, naming the backend.
    answer = client.post("/v1/specs/validate", json={"spec": {**spec, "reward-num-workers": 4}}).json()
    (error,) = answer["errors"]
    assert error["field"] == "reward-num-workers" and "megatron backend" in error["message"]


def test_the_torch_backend_is_not_a_warning_on_every_job(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    answer = client.post("/v1/specs/validate", json={"spec": grpo_spec()}).json()
    assert answer["valid"] and answer["warnings"] == []


def test_a_job_no_pool_can_ever_hold_is_refused_not_queued(api) -> None:  # type: ignore[no-untyped-def]
    """Without --resource Relax's legacy actor of 8 GPUs applies; the local pool has one node of 2."""
    client, _, _ = api
    spec = {k: v for k, v in grpo_spec().items() if k != "resource"}
    dry = client.post("/v1/specs/validate", json={"spec": spec}).json()
    assert not dry["valid"]
    assert dry["demand"]["legacy_layout"] and "legacy default" in dry["demand"]["summary"]
    assert "8 GPUs" in dry["demand"]["summary"]
    assert dry["capacity"]["pool"] == {
        "name": "local",
        "gpus": 2,
        "nodes": 1,
        "largest_node": 2,
        "fits": False,
    }
    assert dry["capacity"]["fits_some_pool"] is False
    (error,) = [e for e in dry["errors"] if e["code"] == "job.unschedulable"]
    assert "legacy default" in error["message"] and "'local'" in error["message"] and error["hint"]
    r = client.post("/v1/jobs", json={"spec": spec})
    assert r.status_code == 422, r.text
    body = r.json()["error"]
    assert body["code"] == "job.unschedulable" and "8 GPU" in body["message"]
    assert [i["code"] for i in body["details"]["issues"] if i["severity"] == "error"] == ["job.unschedulable"]
    assert client.get("/v1/jobs").json()["data"] == []


def test_an_unschedulable_job_names_the_largest_pool(api) -> None:  # type: ignore[no-untyped-def]
    from scheduler.db.models import Node, Pool

    client, _, _ = api
    with client.app.state.db.session() as s:
        s.add(Pool(name="big", accelerator="h200"))
        s.flush()
        s.add(Node(pool="big", name="gpu-0", gpus=8))
    spec = {k: v for k, v in grpo_spec().items() if k != "resource"}
    dry = client.post("/v1/specs/validate", json={"spec": spec}).json()
    assert dry["capacity"]["largest_pool"]["name"] == "big" and dry["capacity"]["largest_pool"]["fits"]
    assert dry["capacity"]["fits_some_pool"] is True and dry["capacity"]["pool"]["fits"] is False
    (error,) = [e for e in dry["errors"] if e["code"] == "job.unschedulable"]
    assert "'big'" in error["message"] and "could hold it" in error["message"] and "'big'" in error["hint"]


def test_flags_a_shell_cannot_split_are_an_error_not_a_crash(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"args": "--hf-checkpoint '/models/tiny"})
    assert r.status_code == 422
    assert r.json()["error"]["details"]["issues"][0]["code"] == "argv.unparsable"
    dry = client.post("/v1/specs/validate", json={"args": "--hf-checkpoint '/models/tiny"}).json()
    assert set(dry) == VALIDATION_KEYS and [e["code"] for e in dry["errors"]] == ["argv.unparsable"]


def test_a_job_and_a_dry_run_carry_the_declared_wire_types(api) -> None:  # type: ignore[no-untyped-def]
    """docs/adr/0008 item 1: the demand is jobspec's ResourceDemand key for key, an allocation its four
    columns, a status one of JobStatus, and every issue of the dry run SpecIssue's six keys (a path issue too)."""
    from jobspec.demand import GpuGroup, ResourceDemand
    from scheduler.dispatch import CeleryDispatcher
    from scheduler.domain.jobs import JobStatus
    from scheduler.scheduling import run_scheduling_pass

    client, _, broker = api
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()
    run_scheduling_pass(client.app.state.db, CeleryDispatcher(broker))
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert set(got["demand"]) == set(ResourceDemand.model_fields)
    assert all(set(g) == set(GpuGroup.model_fields) for g in got["demand"]["groups"])
    assert got["status"] == "ADMITTED" and got["allocations"]
    assert all(set(a) == {"node", "role", "gpus", "pool", "releasing"} for a in got["allocations"])
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    assert {e["to_status"] for e in events} <= {s.value for s in JobStatus} | {None}
    dry = client.post(
        "/v1/specs/validate",
        json={"spec": grpo_spec(**{"max-actor-ckpt-to-keep": 3, "prompt-data": "s3://bucket/x.jsonl"})},
    ).json()
    issues = dry["errors"] + dry["warnings"]
    assert {i["code"] for i in issues} >= {
        "spec.unsupported_scheme",
        "rule.max_actor_ckpt_to_keep_needs_save",
    }
    keys = {"code", "field", "fields", "message", "hint", "severity"}
    assert all(set(i) == keys and i["field"] in i["fields"] for i in issues), issues


def test_a_status_filter_naming_no_status_matches_nothing(api) -> None:  # type: ignore[no-untyped-def]
    """The status column binds a filter's strings as they are (scheduler/db/models.py::job_status_type): one
    that is no JobStatus finds no job (it was a 500 once the column became an enum that checked them), and the
    ORM cannot write one either: the database's CHECK constraint refuses it."""
    import pytest
    import sqlalchemy as sa

    from scheduler.db.models import Job

    client, _, _ = api
    job_id = client.post("/v1/jobs", json={"args": list(TINY_ARGS)}).json()["id"]
    assert [j["id"] for j in client.get("/v1/jobs", params={"status": "QUEUED"}).json()["data"]] == [job_id]
    for status, found in (("LOST", []), ("\x16X", []), ("QUEUED,LOST", [job_id])):
        r = client.get("/v1/jobs", params={"status": status})
        assert r.status_code == 200, r.text
        assert [j["id"] for j in r.json()["data"]] == found, status
    db = client.app.state.db
    with pytest.raises(sa.exc.IntegrityError), db.session() as s:
        s.get(Job, job_id).status = "LOST"  # type: ignore[assignment]


def test_a_jobs_answer_is_what_its_response_model_writes(api) -> None:  # type: ignore[no-untyped-def]
    """POST and GET /v1/jobs write JobDetail's JSON themselves (api/routes/jobs.py `_detail`): the same JSON,
    key for key, as FastAPI would write from the model, with its status code and content type; an idempotent
    repeat answers 200 with the same job."""
    from api.schemas.jobs import JobDetail
    from scheduler.dispatch import CeleryDispatcher
    from scheduler.scheduling import run_scheduling_pass

    client, _, broker = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec()}, headers={"Idempotency-Key": "same"})
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    created = r.json()
    assert created == json.loads(JobDetail.model_validate(created).model_dump_json())
    assert created["spec"]["n_samples_per_prompt"] == 4 and created["allocations"] == []
    again = client.post("/v1/jobs", json={"spec": grpo_spec()}, headers={"Idempotency-Key": "same"})
    assert again.status_code == 200 and again.json()["id"] == created["id"]
    run_scheduling_pass(client.app.state.db, CeleryDispatcher(broker))
    got = client.get(f"/v1/jobs/{created['id']}").json()
    assert got == json.loads(JobDetail.model_validate(got).model_dump_json())
    assert got["spec"] == created["spec"] and got["allocations"]


def test_fastapis_opentelemetry_is_off_unless_asked_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app
    from scheduler.settings import Settings

    assert not create_app(Settings())._native_telemetry.enabled()
    monkeypatch.setenv("RELAX_OTEL", "1")
    assert create_app(Settings())._telemetry["tracing"] is True
