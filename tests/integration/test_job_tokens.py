"""Job credentials over the real API and each real database: the one-time bootstrap exchange, tokens
bound to the live attempt, report sequencing that no sender can move ahead, one 401 for every bad
credential, and the launch path that hands the driver nothing but a bootstrap secret."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa

from scheduler import tasks
from scheduler.db.models import AuditEvent, Job, JobEvent, Metric, Queue
from scheduler.domain.jobs import JobStatus
from scheduler.services.job_tokens import bootstrap_secret, job_token
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.platform import ensure_team
from tests.factories import make_job

RID = {"X-Request-ID": "fixed-request-id"}  # so that whole error bodies can be compared


def _move(client, settings, job_id: str, *steps: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    with client.app.state.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in steps:
            assert svc.transition(job_id, dst, expected_from=src, reason="test"), (src, dst)


def _launched(client, settings, *, queue: str = "default") -> str:  # type: ignore[no-untyped-def]
    """A job as the launch task leaves it: STARTING, attempt 1, not yet claimed."""
    job_id = make_job(client.app.state.db, queue=queue, artifact_root=settings.artifacts)
    _move(client, settings, job_id, ("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"))
    return job_id


def _claim(client, settings, job_id: str, attempt: int = 1) -> dict[str, str]:  # type: ignore[no-untyped-def]
    secret = bootstrap_secret(settings.signing_key(), job_id, attempt)
    r = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    assert r.json()["attempt"] == attempt
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _report(seq: int, attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"attempt": attempt, "seq": seq, **extra}


def _job(client, job_id: str) -> Job:  # type: ignore[no-untyped-def]
    with client.app.state.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def test_bootstrap_secret_is_exchanged_once_and_a_replay_is_refused_and_recorded(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    job_id = _launched(client, settings)
    secret = bootstrap_secret(settings.signing_key(), job_id, 1)
    # the bootstrap secret is not itself a token
    spec = client.get(f"/v1/internal/jobs/{job_id}/spec", headers={"Authorization": f"Bearer {secret}"})
    assert spec.status_code == 401
    headers = _claim(client, settings, job_id)
    assert _job(client, job_id).token_claimed_attempt == 1
    assert client.get(f"/v1/internal/jobs/{job_id}/spec", headers=headers).status_code == 200

    replay = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"})
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "job.bootstrap_reused"
    assert secret not in replay.text
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events").json()["data"]]
    assert "token_claimed" in kinds and "bootstrap_reused" in kinds
    with client.app.state.db.session() as s:
        (row,) = s.scalars(sa.select(AuditEvent).where(AuditEvent.target == job_id))
        assert row.status_code == 409 and row.details["error"] == "job.bootstrap_reused"
    # the driver that claimed first keeps working
    assert (
        client.post(f"/v1/internal/jobs/{job_id}/report", json=_report(0), headers=headers).status_code == 200
    )

    # a wrong secret, another attempt's, or another job's is the plain 401
    other = _launched(client, settings)
    for bad in (
        "rjb_1_" + "0" * 64,
        bootstrap_secret(settings.signing_key(), job_id, 2),
        bootstrap_secret(settings.signing_key(), other, 1),
        job_token(settings.signing_key(), job_id, 1),
    ):
        r = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {bad}"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "job.bad_token"


def test_a_token_ends_with_its_attempt_and_the_next_attempt_gets_its_own(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    job_id = _launched(client, settings)
    old = _claim(client, settings, job_id)
    assert client.post(
        f"/v1/internal/jobs/{job_id}/report", json=_report(0, phase="running"), headers=old
    ).json() == {"stop_requested": False}
    with client.app.state.db.session() as s:
        assert JobLifecycle(s).preempt(job_id, "test") == JobStatus.PREEMPTING
    # while preempting, the attempt is live: the driver hears "stop" and may send its last reports
    assert client.post(f"/v1/internal/jobs/{job_id}/report", json=_report(1), headers=old).json() == {
        "stop_requested": True
    }
    _move(client, settings, job_id, ("PREEMPTING", "QUEUED"))
    # requeued: the attempt is over
    assert client.get(f"/v1/internal/jobs/{job_id}/spec", headers=old).status_code == 401
    assert client.post(f"/v1/internal/jobs/{job_id}/report", json=_report(2), headers=old).status_code == 401
    _move(client, settings, job_id, ("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"))
    assert _job(client, job_id).attempt == 2
    # relaunched: attempt 1's token and bootstrap secret stay dead; attempt 2's work
    assert client.get(f"/v1/internal/jobs/{job_id}/spec", headers=old).status_code == 401
    stale = bootstrap_secret(settings.signing_key(), job_id, 1)
    r = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {stale}"})
    assert r.status_code == 401
    new = _claim(client, settings, job_id, attempt=2)
    assert client.get(f"/v1/internal/jobs/{job_id}/spec", headers=new).json()["attempt"] == 2
    assert (
        client.post(f"/v1/internal/jobs/{job_id}/report", json=_report(0, attempt=2), headers=new).status_code
        == 200
    )


def test_a_finished_job_accepts_no_reports(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    job_id = _launched(client, settings)
    h = _claim(client, settings, job_id)
    metric = {"step": 9999, "name": "rollout/reward", "value": 1.0, "time": 1e9}
    assert (
        client.post(
            f"/v1/internal/jobs/{job_id}/report", json=_report(0, phase="running"), headers=h
        ).status_code
        == 200
    )
    _move(client, settings, job_id, ("RUNNING", "SUCCEEDED"))
    r = client.post(f"/v1/internal/jobs/{job_id}/report", json=_report(1, metrics=[metric]), headers=h)
    assert r.status_code == 401
    assert client.get(f"/v1/jobs/{job_id}/metrics").json()["series"] == {}
    assert _job(client, job_id).report_seq == 0


def test_a_seq_far_ahead_is_refused_and_the_drivers_later_reports_still_land(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    job_id = _launched(client, settings)
    h = _claim(client, settings, job_id)
    url = f"/v1/internal/jobs/{job_id}/report"

    def metric(step: int) -> dict[str, Any]:
        return {"step": step, "name": "train/loss", "value": float(step), "time": 1e9}

    assert (
        client.post(url, json=_report(0, phase="running", metrics=[metric(0)]), headers=h).status_code == 200
    )
    r = client.post(url, json=_report(1_000_000, metrics=[metric(9999)]), headers=h)
    assert r.status_code == 422 and r.json()["error"]["code"] == "report.seq_gap"
    assert r.json()["error"]["details"]["expected"] == 1
    assert _job(client, job_id).report_seq == 0
    r = client.post(url, json=_report(2, metrics=[metric(9999)]), headers=h)  # even one too far
    assert r.status_code == 422
    # the driver goes on 1, 2, 3; a resend of 2 (its answer was lost) is acknowledged and not applied twice
    for seq in (1, 2, 2, 3):
        r = client.post(
            url, json=_report(seq, progress={"step": seq, "total_steps": 3}, metrics=[metric(seq)]), headers=h
        )
        assert r.status_code == 200, r.text
    steps = [p["step"] for p in client.get(f"/v1/jobs/{job_id}/metrics").json()["series"]["train/loss"]]
    assert steps == [0, 1, 2, 3]
    job = _job(client, job_id)
    assert job.report_seq == 3 and job.progress_step == 3
    with client.app.state.db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Metric).where(Metric.step == 9999)) == 0
    # the body's attempt must be the token's
    assert client.post(url, json=_report(4, attempt=2), headers=h).status_code == 409


def test_one_team_s_token_cannot_read_or_report_into_another_team_s_job(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    with client.app.state.db.session() as s:
        team_b = ensure_team(s, "team-b")
        s.add(
            Queue(
                name="b-queue",
                pool="local",
                team_id=team_b.id,
                nominal_gpus=1,
                borrowing_limit=None,
                lending_limit=None,
            )
        )
    a = _launched(client, settings)
    b = _launched(client, settings, queue="b-queue")
    token_b = _claim(client, settings, b)
    _claim(client, settings, a)
    spec = client.get(f"/v1/internal/jobs/{a}/spec", headers=token_b)
    assert spec.status_code == 401 and "spec" not in spec.json()
    report = _report(0, metrics=[{"step": 9999, "name": "rollout/reward", "value": 1.0}])
    assert client.post(f"/v1/internal/jobs/{a}/report", json=report, headers=token_b).status_code == 401
    assert _job(client, a).report_seq == -1
    assert client.get(f"/v1/jobs/{a}/metrics").json()["series"] == {}


def test_every_bad_job_credential_gets_the_same_401(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    live = _launched(client, settings)
    other = _launched(client, settings)
    ended = _launched(client, settings)
    unclaimed = _launched(client, settings)
    _claim(client, settings, live)
    other_token = _claim(client, settings, other)
    ended_token = _claim(client, settings, ended)
    _move(client, settings, ended, ("STARTING", "FAILED"))
    key = settings.signing_key()
    cases = {
        "no such job": ("job_doesnotexist", f"Bearer {job_token(key, 'job_doesnotexist', 1)}"),
        "wrong token": (live, "Bearer rjt_1_" + "f" * 64),
        "malformed token": (live, "Bearer rjt_wrong"),
        "no token": (live, ""),
        "another job's token": (live, other_token["Authorization"]),
        "ended attempt": (ended, ended_token["Authorization"]),
        "never claimed": (unclaimed, f"Bearer {job_token(key, unclaimed, 1)}"),
        "an API key": (live, client.headers["Authorization"]),
    }
    bodies: dict[str, set[str]] = {"spec": set(), "report": set(), "token": set()}
    for name, (job_id, auth) in cases.items():
        headers = {**RID, "Authorization": auth}
        get = client.get(f"/v1/internal/jobs/{job_id}/spec", headers=headers)
        # an invalid body too: the credential is checked before the body is read
        post = client.post(f"/v1/internal/jobs/{job_id}/report", json={"seq": "x"}, headers=headers)
        claim = client.post(f"/v1/internal/jobs/{job_id}/token", headers=headers)
        for r, kind in ((get, "spec"), (post, "report"), (claim, "token")):
            assert r.status_code == 401, (name, kind, r.text)
            bodies[kind].add(r.text)
    assert len(set().union(*bodies.values())) == 1, bodies
    (body,) = bodies["spec"]
    assert "not found" not in body and "job_doesnotexist" not in body


def test_launch_hands_the_ray_job_only_the_bootstrap_secret(api, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """What a reader of Ray's Jobs API sees (entrypoint, environment, metadata) holds no usable token."""
    client, settings, broker = api
    job_id = make_job(client.app.state.db, artifact_root=settings.artifacts)
    _move(client, settings, job_id, ("QUEUED", "ADMITTED"))
    submitted: dict[str, Any] = {}

    class FakeLauncher:
        def submit(
            self, sub_id: str, entrypoint: str, *, env: dict[str, str], metadata: dict[str, str]
        ) -> bool:
            submitted.update(sub_id=sub_id, entrypoint=entrypoint, env=env, metadata=metadata)
            return True

    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: FakeLauncher())
    ctx = tasks.WorkerContext(settings=settings, app=broker)
    ctx.__dict__["db"] = client.app.state.db
    caplog.set_level(logging.DEBUG)
    tasks.launch_job(ctx, job_id)
    assert _job(client, job_id).status == JobStatus.STARTING
    seen = [submitted["entrypoint"], *submitted["env"].values(), *submitted["metadata"].values()]
    token = job_token(settings.signing_key(), job_id, 1)
    assert token not in " ".join(seen) and "runtime.bootstrap" in submitted["entrypoint"]
    assert set(submitted["env"]) == {"RELAX_JOB_ID", "RELAX_JOB_BOOTSTRAP", "RELAX_JOB_ATTEMPT"}
    # nothing the Ray job exposes opens the job's internal API
    for value in seen:
        for value_as in (value, value.split()[-1]):
            r = client.get(
                f"/v1/internal/jobs/{job_id}/spec", headers={"Authorization": f"Bearer {value_as}"}
            )
            assert r.status_code == 401
    # ... and once the driver has claimed, the bootstrap secret opens nothing either
    headers = _claim(client, settings, job_id)
    r = client.post(
        f"/v1/internal/jobs/{job_id}/token",
        headers={"Authorization": f"Bearer {submitted['env']['RELAX_JOB_BOOTSTRAP']}"},
    )
    assert r.status_code == 409
    # a driver that logs its own credential by mistake: the job log keeps it redacted
    secret_line = f"debug: my token is {headers['Authorization']} and bootstrap {submitted['env']['RELAX_JOB_BOOTSTRAP']}"
    r = client.post(
        f"/v1/internal/jobs/{job_id}/report",
        json=_report(0, logs=[{"message": secret_line}], events=[{"kind": "failed", "message": secret_line}]),
        headers=headers,
    )
    assert r.status_code == 200
    stored = client.get(f"/v1/jobs/{job_id}/logs").json()["data"][0]["message"]
    assert (
        "[redacted]" in stored
        and token not in stored
        and "rjb_1_" + "" not in stored.replace("rjb_[redacted]", "")
    )
    with client.app.state.db.session() as s:
        reasons = " ".join(
            e.reason or "" for e in s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id))
        )
    assert token not in reasons and submitted["env"]["RELAX_JOB_BOOTSTRAP"] not in reasons
    # no log record of the launch, the exchange or the reports carried a secret
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    for secret in (token, submitted["env"]["RELAX_JOB_BOOTSTRAP"], client.headers["Authorization"][7:]):
        assert secret not in text


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/internal/jobs/job_x/report"])
def test_error_bodies_never_echo_a_secret(api, path: str) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    leaked = "rlx_" + "S" * 43
    r = client.post(
        path, json={"spec": {leaked: 1}, "name": leaked}, headers={"Authorization": f"Bearer {leaked}"}
    )
    assert r.status_code in (401, 422) and "S" * 43 not in r.text
    r = client.post("/v1/jobs", json={"name": "x", "spec": {leaked: 1}})  # signed in: a spec error naming it
    assert r.status_code == 422 and "S" * 43 not in r.text  # nor as the spec's normalized `rlx-SSS…`
