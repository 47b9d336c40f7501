"""OpenAI's fine-tuning API (`/v1/fine_tuning/jobs`) with the official `openai` SDK as the client, over the real app
(TestClient as the SDK's HTTP client, as test_files.py wires it) on SQLite and PostgreSQL: files uploaded, supervised
and reinforcement jobs created as jobs of the team's queue (their Relax specs checked), listed in pages, retrieved,
cancelled, their events and checkpoints read once the job ran, the fine-tuned model usable as the next job's model;
refusals are the SDK's typed errors naming the field and write nothing; another team sees none of it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from scheduler.db.models import Checkpoint, Job, Metric, StoredFile, Team, utcnow
from scheduler.domain.jobs import FailureReason, JobStatus
from scheduler.services.lifecycle import JobLifecycle
from tests.factories import grpo_spec, seed_area
from tests.integration.test_files import World, make_world

openai = pytest.importorskip("openai")

SFT_ROWS = [
    {
        "messages": [
            {"role": "system", "content": "Answer in \\boxed{}."},
            {"role": "user", "content": f"{a}+{a}"},
            {"role": "assistant", "content": f"\\boxed{{{2 * a}}}"},
        ]
    }
    for a in range(12)
]
RL_ROWS = [
    {"messages": [{"role": "user", "content": f"{a}+1"}], "reference_answer": str(a + 1)} for a in range(6)
]
STRING_CHECK = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}
RUN = [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING")]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    with w.client:
        with w.db.session(read_only=True) as s:
            for team_id in s.scalars(sa.select(Team.id)):
                seed_area(w.settings.artifacts, team_id)
        yield w
    w.db.dispose()


def sdk(w: World, who: str = "alpha") -> Any:
    return openai.OpenAI(
        api_key=w.keys[who], base_url="http://testserver/v1", http_client=w.client, max_retries=0
    )


def _upload(oc: Any, rows: list[dict[str, Any]] | bytes, purpose: str = "fine-tune") -> str:
    data = rows if isinstance(rows, bytes) else _jsonl(rows)
    return oc.files.create(file=("train.jsonl", io.BytesIO(data), "application/jsonl"), purpose=purpose).id


def _jobs(w: World) -> int:
    with w.db.session(read_only=True) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Job)) or 0


def _run_to_end(w: World, job_id: str, final: str = "SUCCEEDED", export: bool = True) -> None:
    """The job runs, reports its losses and checkpoints (as the report route stores them) and ends."""
    with w.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in RUN:
            assert svc.transition(job_id, JobStatus(dst), expected_from=JobStatus(src), reason=f"to {dst}")
        job = s.get(Job, job_id)
        out = Path(job.output_dir)
        for step, loss in (
            (0, 2.5),
            (1, 1.25),
        ):  # the runtime's steps, from 0; its eval after step r is r + 1
            s.add(Metric(job_id=job_id, attempt=1, step=step, name="train/loss", value=loss, time=utcnow()))
            s.add(
                Metric(
                    job_id=job_id, attempt=1, step=step + 1, name="eval/loss", value=loss + 1, time=utcnow()
                )
            )
            for name, value in (("perf/tokens_per_s", 50.0), ("perf/step_time", 2.0)):  # 100 tokens a step
                s.add(Metric(job_id=job_id, attempt=1, step=step, name=name, value=value, time=utcnow()))
            fmt, folder = (
                ("hf", out / "hf" / f"iter_{step}") if export else ("torch", out / "ckpt" / f"{step}")
            )
            folder.mkdir(parents=True, exist_ok=True)
            s.add(
                Checkpoint(
                    job_id=job_id,
                    attempt=1,
                    step=step,
                    path=str(folder),
                    size_bytes=1,
                    format=fmt,
                    time=utcnow(),
                )
            )
        s.flush()
        failure = FailureReason.USER_CODE if final == "FAILED" else None
        assert svc.transition(
            job_id, JobStatus(final), expected_from=JobStatus.RUNNING, reason=f"to {final}", failure=failure
        )


def test_supervised_job_through_the_sdk_is_an_sft_job_of_the_team(world: World) -> None:
    w = world
    oc = sdk(w)
    train = _upload(oc, SFT_ROWS)
    valid = _upload(oc, SFT_ROWS[:4])
    job = oc.fine_tuning.jobs.create(
        model="artifacts://models/tiny",
        training_file=train,
        validation_file=valid,
        suffix="arith",
        seed=7,
        metadata={"project": "arith"},
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 2}
            },
        },
    )
    assert job.object == "fine_tuning.job" and job.status == "queued" and job.seed == 7
    assert (
        job.training_file == train and job.validation_file == valid and job.model == "artifacts://models/tiny"
    )
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == 4
    assert (
        job.method.type == "supervised"
        and job.method.supervised.hyperparameters.learning_rate_multiplier == 2
    )
    assert job.metadata == {"project": "arith"} and job.fine_tuned_model is None and job.error is None
    assert job.organization_id == w.teams["alpha"]

    # it IS a job of the team's queue: Relax SFT on the chat rows, the files as file:// inputs
    r = w.client.get(f"/v1/jobs/{job.id}", headers=w.as_("alpha"))
    assert r.status_code == 200, r.text
    ours = r.json()
    assert ours["queue"] == "alpha-q" and ours["labels"]["fine_tuning"] == "supervised"
    spec = ours["spec"]
    assert spec["loss_type"] == "sft" and spec["input_key"] == "messages" and spec.get("label_key") is None
    assert spec["num_epoch"] == 2 and spec["rollout_batch_size"] == 4 and spec["global_batch_size"] == 4
    assert spec["lr"] == pytest.approx(2e-5) and spec["seed"] == 7
    with w.db.session(read_only=True) as s:
        train_row = s.get(StoredFile, train)
        assert train_row is not None
    assert spec["prompt_data"].endswith(train_row.key.rsplit("/", 1)[-1]) or train in spec["prompt_data"]
    assert spec["eval_prompt_data"][0] == "validation"

    # the legacy top-level hyperparameters are the supervised method's
    legacy = oc.fine_tuning.jobs.create(
        model="artifacts://models/tiny", training_file=train, hyperparameters={"n_epochs": 1}
    )
    assert legacy.method.type == "supervised" and legacy.hyperparameters.n_epochs == 1
    assert legacy.hyperparameters.batch_size == 8  # auto: min(8, rows)

    # list pages as OpenAI pages them (newest first, after/limit, has_more), the SDK's auto-paging included
    page = oc.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in page.data] == [legacy.id] and page.has_more is True
    assert [j.id for j in oc.fine_tuning.jobs.list(limit=1, after=legacy.id).data] == [job.id]
    assert [j.id for j in oc.fine_tuning.jobs.list(limit=1)] == [legacy.id, job.id]
    assert [j.id for j in oc.fine_tuning.jobs.list(metadata={"project": "arith"})] == [job.id]
    assert oc.fine_tuning.jobs.retrieve(job.id).id == job.id

    # it runs: events (state changes, losses, checkpoints), checkpoints with metrics, the fine-tuned model
    _run_to_end(w, job.id)
    done = oc.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.finished_at is not None and done.trained_tokens == 200
    assert done.fine_tuned_model == f"ft:tiny:alpha:arith:{job.id}"
    events = oc.fine_tuning.jobs.list_events(job.id, limit=50).data
    assert events[0].message.startswith("succeeded") and all(
        e.object == "fine_tuning.job.event" for e in events
    )
    assert [e.data["train_loss"] for e in events if e.type == "metrics"] == [1.25, 2.5]
    assert [e.message for e in events if e.type == "metrics"][-1] == (
        "Step 1: training loss=2.5000, validation loss=3.5000"
    )
    assert any(e.message.startswith("queued") for e in events)
    first = oc.fine_tuning.jobs.list_events(job.id, limit=2)
    assert (
        first.has_more
        and oc.fine_tuning.jobs.list_events(job.id, after=first.data[-1].id, limit=50).data == events[2:]
    )
    ckpts = oc.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [2, 1]
    assert ckpts[0].metrics.train_loss == 1.25 and ckpts[0].metrics.step == 2
    assert ckpts[0].metrics.valid_loss == 2.25 and ckpts[1].metrics.valid_loss == 3.5
    assert ckpts[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-2"
    assert ckpts[0].fine_tuning_job_id == job.id

    # the fine-tuned model is the next job's model: its export, by job://
    nxt = oc.fine_tuning.jobs.create(model=done.fine_tuned_model, training_file=train)
    spec = w.client.get(f"/v1/jobs/{nxt.id}", headers=w.as_("alpha")).json()["spec"]
    assert spec["hf_checkpoint"].endswith("hf/iter_1") and nxt.model == done.fine_tuned_model
    assert oc.fine_tuning.jobs.retrieve(nxt.id).status == "queued"
    # and so is one of its checkpoints (step 1's export), by its fine_tuned_model_checkpoint
    from_ckpt = oc.fine_tuning.jobs.create(model=ckpts[1].fine_tuned_model_checkpoint, training_file=train)
    spec = w.client.get(f"/v1/jobs/{from_ckpt.id}", headers=w.as_("alpha")).json()["spec"]
    assert spec["hf_checkpoint"].endswith("hf/iter_0")
    err = _refused(
        w, openai.BadRequestError, {"model": f"{done.fine_tuned_model}:ckpt-step-9", "training_file": train}
    )
    assert err.body["param"] == "model" and "no checkpoint of step 9" in err.body["message"]


def test_reinforcement_job_is_grpo_with_the_graders_reward(world: World) -> None:
    w = world
    oc = sdk(w)
    train = _upload(oc, RL_ROWS)
    job = oc.fine_tuning.jobs.create(
        model="artifacts://models/tiny",
        training_file=train,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": STRING_CHECK | {"operation": "ilike"},
                "hyperparameters": {"compute_multiplier": 2, "reasoning_effort": "low", "batch_size": 3},
            },
        },
    )
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.operation == "ilike"
    assert job.method.reinforcement.hyperparameters.reasoning_effort == "low"
    spec = w.client.get(f"/v1/jobs/{job.id}", headers=w.as_("alpha")).json()["spec"]
    assert (
        spec["advantage_estimator"] == "grpo"
        and spec["custom_rm_path"] == "runtime.rewards.graders.string_check_ilike"
    )
    assert spec["label_key"] == "reference_answer" and spec["input_key"] == "messages"
    assert spec["n_samples_per_prompt"] == 8 and spec["global_batch_size"] == 24
    assert spec["rollout_max_response_len"] == 256 and spec["apply_chat_template"] is True

    fuzzy = STRING_CHECK | {"type": "text_similarity", "evaluation_metric": "fuzzy_match"}
    fuzzy.pop("operation")
    job2 = oc.fine_tuning.jobs.create(
        model="artifacts://models/tiny",
        training_file=train,
        method={"type": "reinforcement", "reinforcement": {"grader": fuzzy}},
    )
    spec = w.client.get(f"/v1/jobs/{job2.id}", headers=w.as_("alpha")).json()["spec"]
    assert spec["custom_rm_path"] == "runtime.rewards.graders.fuzzy_match"

    # cancel: cancelled at once; a job that failed says why
    cancelled = oc.fine_tuning.jobs.cancel(job2.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    with pytest.raises(openai.ConflictError):
        oc.fine_tuning.jobs.cancel(job2.id)
    _run_to_end(w, job.id, final="FAILED", export=False)
    failed = oc.fine_tuning.jobs.retrieve(job.id)
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "user_code"
    assert failed.fine_tuned_model is None


def _refused(w: World, exc: type, body: dict[str, Any], who: str = "alpha") -> Any:
    before = _jobs(w)
    with pytest.raises(exc) as caught:
        sdk(w, who).fine_tuning.jobs.create(**body)
    assert _jobs(w) == before  # nothing written
    return caught.value


def test_refusals_are_the_sdks_typed_errors_naming_the_field(world: World) -> None:
    w = world
    oc = sdk(w)
    train = _upload(oc, SFT_ROWS)
    ok = {"model": "artifacts://models/tiny", "training_file": train}

    def param(body: dict[str, Any], exc: type = openai.BadRequestError) -> str:
        err = _refused(w, exc, body)
        assert err.body["type"] == "invalid_request_error" and err.body["message"]
        return err.body["param"]

    assert param(ok | {"training_file": "file-nope"}) == "training_file"
    assert param(ok | {"training_file": _upload(oc, SFT_ROWS, purpose="dataset")}) == "training_file"
    assert param(ok | {"training_file": _upload(oc, b"not json\n")}) == "training_file"
    assert param(ok | {"training_file": _upload(oc, [{"prompt": "x"}])}) == "training_file"
    no_assistant = [{"messages": [{"role": "user", "content": "hi"}]}]
    assert param(ok | {"training_file": _upload(oc, no_assistant)}) == "training_file"
    omega_file = _upload(sdk(w, "omega"), SFT_ROWS)
    err = _refused(w, openai.BadRequestError, ok | {"training_file": omega_file})
    assert err.body["param"] == "training_file" and omega_file in err.body["message"]
    assert param(ok | {"validation_file": "file-nope"}) == "validation_file"
    assert param(ok | {"method": {"type": "distillation"}}) == "method.type"
    dpo = param(ok | {"method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}})
    assert dpo == "method.type"
    assert param(ok | {"model": "gpt-4o-mini"}) == "model"
    assert param(ok | {"model": "ft:tiny:alpha::job_0000000000000000000"}) == "model"
    py = {"type": "python", "name": "p", "source": "def grade(s, i): return 1"}
    rl = {"training_file": _upload(oc, RL_ROWS), "model": "artifacts://models/tiny"}
    assert param(rl | {"method": {"type": "reinforcement", "reinforcement": {"grader": py}}}) == (
        "method.reinforcement.grader.type"
    )
    bleu = STRING_CHECK | {"type": "text_similarity", "evaluation_metric": "bleu"}
    assert param(rl | {"method": {"type": "reinforcement", "reinforcement": {"grader": bleu}}}) == (
        "method.reinforcement.grader.evaluation_metric"
    )
    no_ref = STRING_CHECK | {"reference": "{{item.answer}}"}
    assert (
        param(rl | {"method": {"type": "reinforcement", "reinforcement": {"grader": no_ref}}})
        == "training_file"
    )
    assert param(ok | {"hyperparameters": {"n_epochs": 0}}) == "hyperparameters.n_epochs"
    twice = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1}}}
    assert param(ok | {"hyperparameters": {"n_epochs": 2}, "method": twice}) == "hyperparameters"
    wandb = [{"type": "wandb", "wandb": {"project": "p"}}]
    assert param(ok | {"integrations": wandb}) == "integrations"
    assert (
        param(ok | {"hyperparameters": {"batch_size": 99}}) == "method.supervised.hyperparameters.batch_size"
    )

    # roles and keys as for jobs: a viewer may not create; no key is a 401
    _refused(w, openai.PermissionDeniedError, ok, who="viewer")
    bad = openai.OpenAI(
        api_key="rlx_nope", base_url="http://testserver/v1", http_client=w.client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad.fine_tuning.jobs.list()


def test_another_team_sees_none_of_it(world: World) -> None:
    w = world
    oc = sdk(w)
    job = oc.fine_tuning.jobs.create(model="artifacts://models/tiny", training_file=_upload(oc, SFT_ROWS))
    other = sdk(w, "omega")
    assert other.fine_tuning.jobs.list().data == []
    for call in (
        lambda: other.fine_tuning.jobs.retrieve(job.id),
        lambda: other.fine_tuning.jobs.cancel(job.id),
        lambda: other.fine_tuning.jobs.list_events(job.id),
        lambda: other.fine_tuning.jobs.checkpoints.list(job.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert oc.fine_tuning.jobs.retrieve(job.id).status == "queued"
    # the viewer of the team reads it, may not cancel it
    viewer = sdk(w, "viewer")
    assert [j.id for j in viewer.fine_tuning.jobs.list()] == [job.id]
    with pytest.raises(openai.PermissionDeniedError):
        viewer.fine_tuning.jobs.cancel(job.id)
    # a plain job of the team is not a fine-tuning job
    plain = w.client.post("/v1/jobs", json={"spec": grpo_spec(), "name": "plain"}, headers=w.as_("alpha"))
    assert plain.status_code == 201, plain.text
    with pytest.raises(openai.NotFoundError):
        oc.fine_tuning.jobs.retrieve(plain.json()["id"])
    assert [j.id for j in oc.fine_tuning.jobs.list()] == [job.id]


# The S3 store: the training file is read from the bucket, in chunks, when the job is created ----------------------
s3 = pytest.importorskip("tests.integration.test_files_s3").s3


@pytest.fixture
def s3_world(s3: str, tmp_path: Path) -> Iterator[World]:
    from scheduler.settings import FileSettings
    from tests.dbclone import migrated_sqlite

    url = migrated_sqlite(tmp_path / "relax.db")  # a copy of one `upgrade()` migrated
    files = FileSettings(
        store="s3", s3_endpoint_url=s3, s3_bucket="relax-files", s3_prefix="team-files", s3_region="us-east-1",
        s3_access_key_id="k", s3_secret_access_key="s", max_file_bytes=4_000_000,
    )  # fmt: skip
    w = make_world(url, tmp_path, files)
    with w.client:
        seed_area(w.settings.artifacts, w.teams["alpha"])
        yield w
    w.db.dispose()


def test_a_training_file_in_s3_is_checked_line_by_line(s3_world: World) -> None:
    w = s3_world
    oc = sdk(w)
    rows = SFT_ROWS * 800  # 1.3 MB: the store's reads come in 1 MiB chunks, a line spans two
    train = _upload(oc, rows)
    job = oc.fine_tuning.jobs.create(model="artifacts://models/tiny", training_file=train)
    assert job.status == "queued" and job.hyperparameters.batch_size == 8
    broken = _jsonl(rows[:8000]) + b'{"messages": "no"}\n' + _jsonl(rows[8000:])  # past the first chunk
    err = _refused(
        w, openai.BadRequestError, {"model": "artifacts://models/tiny", "training_file": _upload(oc, broken)}
    )
    assert err.body["param"] == "training_file" and "line 8001" in err.body["message"]


def test_the_platforms_own_sdk_speaks_the_fine_tuning_routes(world: World) -> None:
    """client/sdk.py's fine-tuning methods over the real app: create, list, get, events, cancel, checkpoints, and
    a refusal as its ApiError naming the field (OpenAI's error shape read as the platform's)."""
    from client.sdk import ApiError, RelaxClient

    w = world
    train = _upload(sdk(w), SFT_ROWS)
    c = RelaxClient("http://testserver", "unused")
    c._http = w.client  # the TestClient is an httpx.Client over the app
    w.client.headers.update(w.as_("alpha"))
    job = c.create_fine_tuning_job(
        model="artifacts://models/tiny", training_file=train, method={"type": "supervised"}
    )
    assert job["object"] == "fine_tuning.job" and job["status"] == "queued"
    page = c.list_fine_tuning_jobs(limit=5)
    assert [j["id"] for j in page["data"]] == [job["id"]] and page["has_more"] is False
    assert c.get_fine_tuning_job(job["id"])["training_file"] == train
    assert c.fine_tuning_events(job["id"])["object"] == "list"
    assert c.cancel_fine_tuning_job(job["id"])["status"] == "cancelled"
    assert c.fine_tuning_checkpoints(job["id"])["data"] == []
    with pytest.raises(ApiError) as err:
        c.create_fine_tuning_job(
            model="artifacts://models/tiny", training_file=train, method={"type": "nope"}
        )
    assert err.value.status == 400 and "method.type" in err.value.message + str(err.value.details)
