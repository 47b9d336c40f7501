"""CI evals over the real app and each database: the eval-only job submitted through the submission service, the
refusals that write nothing (a threshold on a metric the eval will not produce, a bad threshold, a model the team
may not read), the verdict when the job ends (passed, failed, error), the `eval.completed` message signed to the
team's endpoint, a job's checkpoint as the model, and isolation between teams."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from scheduler.db.models import AuditEvent, Checkpoint, Eval, Job, Metric, PriorityClass, Team, utcnow
from scheduler.dispatch import CeleryDispatcher
from scheduler.domain import webhooks as wh
from scheduler.domain.errors import InvalidRequest
from scheduler.domain.jobs import FailureReason, JobStatus
from scheduler.scheduling import run_scheduling_pass
from scheduler.services import platform
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from tests.factories import grpo_spec, make_broker_app, make_job, seed_area
from tests.integration import test_webhooks
from tests.integration.test_webhooks import Receiver, World, _deliver_due

# the webhook tests' fixtures: the app over each database with teams alpha and omega, and a real HTTP receiver
world = test_webhooks.world
receiver = test_webhooks.receiver

RUN = [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING")]
ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


def _seed(w: World, team: str) -> Path:
    with w.db.session() as s:
        team_id = s.scalar(sa.select(Team.id).where(Team.name == team))
    area = seed_area(w.settings.artifacts, team_id)
    (area / "data" / "test.jsonl").write_text('{"prompt": "2+2", "label": "4"}\n')
    return area


def _body(**over: object) -> dict:
    body: dict = {
        "model": {"path": "artifacts://models/tiny"},
        "eval_prompt_data": ["arith", "artifacts://data/test.jsonl"],
        "n_samples_per_eval_prompt": 4,
        "thresholds": ["eval/arith >= 0.5", {"metric": "eval/arith-pass@4", "op": ">", "value": 0.2}],
        "spec": {"rm-type": "math", "input-key": "prompt", "label-key": "label", "eval-temperature": 0.0},
    }
    body.update(over)
    return body


def _counts(w: World) -> tuple[int, int]:
    with w.db.session(read_only=True) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Job)), s.scalar(
            sa.select(sa.func.count()).select_from(Eval)
        )


def _end(w: World, job_id: str, metrics: dict[str, float], final: str = "SUCCEEDED") -> None:
    """The job runs, reports its metrics (as the report route stores them) and ends."""
    with w.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in RUN:
            assert svc.transition(job_id, JobStatus(dst), expected_from=JobStatus(src), reason=f"to {dst}")
        for name, value in metrics.items():
            s.add(Metric(job_id=job_id, attempt=1, step=1, name=name, value=value, time=utcnow()))
        s.flush()
        failure = FailureReason.USER_CODE if final == "FAILED" else None
        assert svc.transition(
            job_id, JobStatus(final), expected_from=JobStatus.RUNNING, reason=f"to {final}", failure=failure
        )


def test_an_eval_runs_as_a_high_priority_eval_only_job_and_ends_passed(
    world: World, receiver: Receiver
) -> None:
    w = world
    area = _seed(w, "alpha")
    hook = w.client.post(
        "/v1/webhooks", json={"url": receiver.url, "event_types": ["eval.*"]}, headers=w.as_("alpha")
    ).json()
    r = w.client.post("/v1/evals", json=_body(name="ci-tiny"), headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    ev = r.json()
    assert ev["outcome"] == "running" and ev["job_status"] == "QUEUED" and ev["name"] == "ci-tiny"
    assert ev["model_key"] == "artifacts://models/tiny"
    assert ev["model"]["hf_checkpoint"] == str((area / "models" / "tiny").resolve())
    assert [t["verdict"] for t in ev["thresholds"]] == ["pending", "pending"]
    assert "eval/arith-pass@4" in ev["expected_metrics"] and "eval/arith-pass@8" not in ev["expected_metrics"]

    job = w.client.get(f"/v1/jobs/{ev['job_id']}", headers=w.as_("alpha")).json()
    spec = job["spec"]
    # Relax's run with no rollout left: it evaluates once (runtime.eval.eval_only), on the rollout role only
    assert spec["debug_rollout_only"] is True and spec["num_rollout"] == spec["start_rollout_id"] == 1
    assert spec["eval_prompt_data"] == ["arith", str((area / "data" / "test.jsonl").resolve())]
    assert spec["n_samples_per_eval_prompt"] == 4 and spec["log_passrate"] is True
    assert spec["rm_type"] == "math" and spec["eval_temperature"] == 0.0
    assert job["labels"]["relax.eval"] == ev["id"]
    with w.db.session(read_only=True) as s:  # the eval class: above the classes a team trains at by default
        classes = dict(s.execute(sa.select(PriorityClass.name, PriorityClass.value)).all())
    assert (job["priority_class"], job["priority"]) == ("eval", classes["eval"])
    assert classes["eval"] > max(classes[c] for c in ("low", "normal"))

    with w.db.session(read_only=True) as s:
        audit = s.scalars(sa.select(AuditEvent).where(AuditEvent.path == "/v1/evals")).all()
        assert [(a.status_code, a.target) for a in audit] == [(201, ev["id"])]

    _end(w, ev["job_id"], {"eval/arith": 0.75, "eval/arith-pass@4": 1.0, "eval/arith-truncated_ratio": 0.0})
    done = w.client.get(f"/v1/evals/{ev['id']}", headers=w.as_("alpha")).json()
    assert done["outcome"] == "passed" and done["job_status"] == "SUCCEEDED" and done["finished_at"]
    assert [(t["actual"], t["verdict"]) for t in done["thresholds"]] == [(0.75, "pass"), (1.0, "pass")]
    assert done["metric_values"]["eval/arith"] == 0.75

    # eval.completed, signed, to the team's endpoint (its job.* messages were not asked for)
    assert _deliver_due(w)
    assert len(receiver.got) == 1
    got = receiver.got[0]
    ts = int(got.headers["webhook-timestamp"])
    assert wh.verify(
        hook["secret"], got.headers["webhook-id"], ts, got.body, got.headers["webhook-signature"]
    )
    message = json.loads(got.body)
    assert message["type"] == "eval.completed"
    assert message["data"]["id"] == ev["id"] and message["data"]["outcome"] == "passed"
    assert message["data"]["thresholds"][0]["verdict"] == "pass"
    log = w.client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=w.as_("alpha"))
    assert log.status_code == 200, log.text
    assert log.json()["data"][0]["payload"]["data"]["outcome"] == "passed"

    # the model's history, team-scoped
    history = w.client.get("/v1/evals", params={"model": "artifacts://models/tiny"}, headers=w.as_("alpha"))
    assert [e["id"] for e in history.json()["data"]] == [ev["id"]]
    assert w.client.get("/v1/evals", headers=w.as_("omega")).json()["data"] == []
    other = w.client.get(f"/v1/evals/{ev['id']}", headers=w.as_("omega"))
    assert other.status_code == 404 and other.json()["error"]["code"] == "eval.not_found"


def test_a_threshold_that_fails_fails_the_eval_and_a_failed_job_is_an_error(world: World) -> None:
    w = world
    _seed(w, "alpha")
    failing = w.client.post("/v1/evals", json=_body(), headers=w.as_("alpha")).json()
    _end(w, failing["job_id"], {"eval/arith": 0.25, "eval/arith-pass@4": 0.5})
    done = w.client.get(f"/v1/evals/{failing['id']}", headers=w.as_("alpha")).json()
    assert done["outcome"] == "failed"
    assert [t["verdict"] for t in done["thresholds"]] == ["fail", "pass"]
    assert "eval/arith >= 0.5" in done["reason"]

    missing = w.client.post("/v1/evals", json=_body(), headers=w.as_("alpha")).json()
    _end(w, missing["job_id"], {"eval/arith": 0.9})  # pass@4 never reported
    done = w.client.get(f"/v1/evals/{missing['id']}", headers=w.as_("alpha")).json()
    assert done["outcome"] == "error" and done["thresholds"][1]["verdict"] == "missing"

    broken = w.client.post("/v1/evals", json=_body(), headers=w.as_("alpha")).json()
    _end(w, broken["job_id"], {}, final="FAILED")
    done = w.client.get(f"/v1/evals/{broken['id']}", headers=w.as_("alpha")).json()
    assert done["outcome"] == "error" and "FAILED" in done["reason"]

    outcomes = {
        e["id"]: e["outcome"]
        for e in w.client.get("/v1/evals", params={"limit": 2}, headers=w.as_("alpha")).json()["data"]
    }
    assert outcomes == {broken["id"]: "error", missing["id"]: "error"}
    only_failed = w.client.get("/v1/evals", params={"outcome": "failed"}, headers=w.as_("alpha")).json()
    assert [e["id"] for e in only_failed["data"]] == [failing["id"]]


def test_refusals_name_the_field_and_write_nothing(world: World) -> None:
    w = world
    _seed(w, "alpha")
    before = _counts(w)

    def refused(body: dict) -> dict:
        r = w.client.post("/v1/evals", json=body, headers=w.as_("alpha"))
        assert r.status_code == 422, r.text
        return r.json()["error"]["details"]["issues"][0]

    issue = refused(_body(thresholds=["eval/gsm8k >= 0.6"]))
    assert issue["field"] == "thresholds[0].metric" and issue["code"] == "eval.unknown_metric"
    assert "eval/arith" in issue["hint"] and "eval/arith-pass@4" in issue["hint"]
    # pass@k only where there are several samples
    issue = refused(_body(n_samples_per_eval_prompt=1, thresholds=["eval/arith-pass@1 >= 0.5"]))
    assert issue["field"] == "thresholds[0].metric"
    assert refused(_body(thresholds=["eval/arith => 0.5"]))["field"] == "thresholds[0]"
    assert refused(_body(thresholds=["eval/arith >= nan"]))["field"] == "thresholds[0]"
    issue = refused(_body(model={"path": "artifacts://models/none"}))
    assert issue["field"] == "model.path"
    assert refused(_body(model={"path": "/etc"}))["field"] == "model.path"
    assert refused(_body(model={}))["field"] == "model"
    assert refused(_body(model={"job": "nope"}))["field"] == "model.job"
    assert refused(_body(spec={"num-rollout": 5}))["field"] == "spec.num-rollout"
    assert refused(_body(spec={"eval-prompt-data": ["a", "b"]}))["field"] == "spec.eval-prompt-data"
    assert (
        refused(_body(eval_prompt_data=["arith", "artifacts://data/none.jsonl"]))["field"]
        == "eval_prompt_data"
    )
    assert refused(_body(eval_prompt_data=["ar/ith", "artifacts://data/test.jsonl"]))["field"] == (
        "eval_prompt_data[0]"
    )
    assert refused(_body(spec={"eval-temperature": -1}))["field"].startswith("spec.eval-temperature")
    assert _counts(w) == before


def test_an_eval_config_names_the_metrics(world: World) -> None:
    w = world
    area = _seed(w, "alpha")
    (area / "evals.yaml").write_text(
        "eval:\n  defaults: {n_samples_per_eval_prompt: 2}\n"
        "  datasets:\n    - {name: easy, path: data/test.jsonl}\n"
        "    - {name: hard, path: data/test.jsonl, n_samples_per_eval_prompt: 1}\n"
    )
    body = _body(eval_prompt_data=None, eval_config="artifacts://evals.yaml", pass_at_k=True)
    body["thresholds"] = ["eval/easy-pass@2 >= 0.5", "eval/hard >= 0.1"]
    r = w.client.post("/v1/evals", json=body, headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    assert [d["name"] for d in r.json()["datasets"]] == ["easy", "hard"]
    body["thresholds"] = ["eval/hard-pass@2 >= 0.5"]  # one sample per prompt there: no pass@2
    r = w.client.post("/v1/evals", json=body, headers=w.as_("alpha"))
    assert r.status_code == 422 and "eval/easy-pass@2" in r.text
    many = "".join(f"    - {{name: s{i}, path: data/test.jsonl}}\n" for i in range(33))
    (area / "many.yaml").write_text("eval:\n  datasets:\n" + many)
    r = w.client.post(
        "/v1/evals", json=body | {"eval_config": "artifacts://many.yaml"}, headers=w.as_("alpha")
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "eval_config"
    (area / "none.yaml").write_text("eval: {defaults: {}}\n")
    r = w.client.post(
        "/v1/evals", json=body | {"eval_config": "artifacts://none.yaml"}, headers=w.as_("alpha")
    )
    assert r.status_code == 422 and "needs eval.datasets" in r.text
    r = w.client.post(
        "/v1/evals", json=body | {"eval_config": "artifacts://nowhere.yaml"}, headers=w.as_("alpha")
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "eval_config"


def test_a_jobs_checkpoint_is_the_model(world: World) -> None:
    w = world
    area = _seed(w, "alpha")
    r = w.client.post(
        "/v1/jobs",
        json={
            "name": "trained",
            "queue": "alpha-q",
            "spec": {
                "train-backend": "torch",
                "hf-checkpoint": "artifacts://models/tiny",
                "prompt-data": "artifacts://data/train.jsonl",
                "input-key": "prompt",
                "label-key": "label",
                "rm-type": "math",
                "rollout-batch-size": 4,
                "n-samples-per-prompt": 4,
                "global-batch-size": 16,
                "num-rollout": 3,
                "colocate": True,
                "resource": {"actor": [1, 1], "rollout": [1, 1]},
                "save": "ckpt",
            },
        },  # fmt: skip
        headers=w.as_("alpha"),
    )
    assert r.status_code == 201, r.text
    trained = r.json()
    iteration = Path(trained["output_dir"]) / "ckpt" / "iter_0000001"
    (iteration / "model").mkdir(parents=True)
    with w.db.session() as s:
        s.add(
            Checkpoint(job_id=trained["id"], attempt=1, step=1, path=str(iteration), size_bytes=1,
                       format="torch", time=utcnow())
        )  # fmt: skip
    body = _body(model={"job": trained["id"], "checkpoint_step": 1})
    r = w.client.post("/v1/evals", json=body, headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    ev = r.json()
    assert ev["model_key"] == f"job:{trained['id']}" and ev["model"]["step"] == 1
    assert ev["model"]["hf_checkpoint"] == str((iteration / "model").resolve())
    job = w.client.get(f"/v1/jobs/{ev['job_id']}", headers=w.as_("alpha")).json()
    assert job["submitted"]["inputs"][0]["job_id"] == trained["id"]  # the submission's job:// resolution
    issue = w.client.post(
        "/v1/evals", json=_body(model={"job": trained["id"], "checkpoint_step": 7}), headers=w.as_("alpha")
    ).json()["error"]["details"]["issues"][0]
    assert issue["field"] == "model.checkpoint_step" and "[1]" in issue["hint"]
    # another team's job is no model of omega's
    _seed(w, "omega")
    r = w.client.post("/v1/evals", json=_body(model={"job": trained["id"]}), headers=w.as_("omega"))
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "model.job"
    assert area.exists()


def test_the_eval_jobs_notify_urls_get_its_result_too(world: World, receiver: Receiver) -> None:
    w = world
    _seed(w, "alpha")
    body = _body()
    body["spec"] = body["spec"] | {"notify-urls": receiver.url + "/ci"}
    ev = w.client.post("/v1/evals", json=body, headers=w.as_("alpha")).json()
    _end(w, ev["job_id"], {"eval/arith": 0.75, "eval/arith-pass@4": 1.0})
    _deliver_due(w)
    got = [g for g in receiver.got if json.loads(g.body)["type"] == "eval.completed"]
    assert len(got) == 1 and got[0].path == "/hook/ci"
    secret = wh.job_secret(w.settings.signing_key(), ev["job_id"])  # the job's own, as for its status changes
    ts = int(got[0].headers["webhook-timestamp"])
    assert wh.verify(
        secret, got[0].headers["webhook-id"], ts, got[0].body, got[0].headers["webhook-signature"]
    )
    assert json.loads(got[0].body)["data"]["outcome"] == "passed"
    # and the job's status changes, as any job's --notify-urls
    assert {json.loads(g.body)["type"] for g in receiver.got} >= {"job.queued", "job.succeeded"}


def _pass(w: World):  # type: ignore[no-untyped-def]
    return run_scheduling_pass(w.db, CeleryDispatcher(make_broker_app(w.settings.broker_url, w.home)))


def test_an_eval_preempts_the_teams_training_job_holding_its_slot_and_runs_first(world: World) -> None:
    """docs/adr/0011: pool `local` of 2 slots; alpha's training job holds alpha's one (its nominal quota), omega's
    the other. Alpha's eval, at the eval class, preempts alpha's job at once (it has run a moment, no checkpoint),
    never omega's (within its quota), and runs first; the training job waits behind it."""
    w = world
    _seed(w, "alpha")
    train = make_job(w.db, queue="alpha-q", name="train", artifact_root=w.settings.artifacts)
    other = make_job(w.db, queue="omega-q", name="other", artifact_root=w.settings.artifacts)
    assert set(_pass(w).admitted) == {train, other}
    with w.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in RUN[1:]:
            assert svc.transition(train, JobStatus(dst), expected_from=JobStatus(src), reason=f"to {dst}")
    r = w.client.post("/v1/evals", json=_body(), headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    ev_job = r.json()["job_id"]
    r = _pass(w)
    assert r.preempted == [train] and ev_job in r.waiting and "preempting" in r.waiting[ev_job], r
    with w.db.session() as s:
        assert s.get(Job, other).status == JobStatus.ADMITTED
        JobLifecycle(s).transition(
            train, JobStatus.QUEUED, expected_from=JobStatus.PREEMPTING, reason="stopped"
        )
    r = _pass(w)
    assert r.admitted == [ev_job] and not r.preempted and train in r.waiting, r
    with w.db.session(read_only=True) as s:
        assert (
            s.get(Job, ev_job).status == JobStatus.ADMITTED and s.get(Job, train).status == JobStatus.QUEUED
        )
    # an eval may still ask for a lower class it is granted: it then waits as any job of that class
    r = w.client.post("/v1/evals", json=_body(priority_class="low"), headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    low = w.client.get(f"/v1/jobs/{r.json()['job_id']}", headers=w.as_("alpha")).json()
    assert (low["priority_class"], low["priority"]) == ("low", -100)
    assert not _pass(w).preempted


def test_the_eval_class_is_for_eval_jobs_only(world: World) -> None:
    w = world
    _seed(w, "alpha")
    before = _counts(w)
    r = w.client.post(
        "/v1/jobs",
        json={"name": "sneaky", "queue": "alpha-q", "priority_class": "eval", "spec": grpo_spec()},
        headers=w.as_("alpha"),
    )
    assert r.status_code == 422, r.text
    issue = r.json()["error"]["details"]["issues"][0]
    assert (issue["field"], issue["code"]) == ("priority_class", "priority_class.eval_only")
    assert "POST /v1/evals" in issue["hint"]
    assert _counts(w) == before
    # a team sees the classes it may submit jobs at: not the eval class, which its evals have without a grant
    team = w.client.get("/v1/teams/alpha", headers=w.as_("alpha")).json()
    assert "eval" not in team["priority_classes"] and "normal" in team["priority_classes"]
    # an admin grants training classes; the eval class is not granted (every team's evals have it)
    with w.db.session() as s:
        try:
            platform.update_team(s, ADMIN, "alpha", {"allowed_priority_classes": ["normal", "eval"]})
            raise AssertionError("granted the eval class")
        except InvalidRequest as err:
            assert err.details["issues"][0]["field"] == "allowed_priority_classes"
    with w.db.session() as s:  # a team with an explicit grant (without the eval class) still evals at it
        platform.update_team(s, ADMIN, "alpha", {"allowed_priority_classes": ["low"]})
    r = w.client.post("/v1/evals", json=_body(), headers=w.as_("alpha"))
    assert r.status_code == 201, r.text
    job = w.client.get(f"/v1/jobs/{r.json()['job_id']}", headers=w.as_("alpha")).json()
    assert job["priority_class"] == "eval"
    r = w.client.post("/v1/evals", json=_body(priority_class="normal"), headers=w.as_("alpha"))
    assert r.status_code == 403 and r.json()["error"]["details"]["issues"][0]["field"] == "priority_class"
