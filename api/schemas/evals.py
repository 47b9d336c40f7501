"""CI evals (`/v1/evals`; docs/reference/evals.md): a model, eval sets with Relax's eval semantics, thresholds on
their metrics; the verdict of each."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from api.schemas import Labels, RequestBody
from jobspec.bounds import MAX_PATH_LENGTH
from scheduler.db.models import INTEGER_MAX
from scheduler.domain.evals import EvalOutcome, Verdict
from scheduler.domain.jobs import JobStatus

_Path = Annotated[str, Field(max_length=MAX_PATH_LENGTH)]
Operator = Literal[">=", ">", "<=", "<", "=="]


class EvalModel(RequestBody):
    """The model to evaluate: one of your team's jobs (its Hugging Face export, or the checkpoint of
    `checkpoint_step`) or a path your team may read."""

    job: str | None = Field(
        None,
        max_length=100,
        description="A job of your team, by id or name (by name: its newest SUCCEEDED job of that name).",
    )
    checkpoint_step: int | None = Field(
        None,
        ge=0,
        le=INTEGER_MAX,
        description="With `job`: the checkpoint of this step; without it: the job's newest export, else its "
        "newest checkpoint.",
    )
    path: _Path | None = Field(
        None,
        description="A Hugging Face model folder your team may read: artifacts://models/tiny, job://<job>/hf, "
        "an uploaded model (file://<id>), a granted path, or a hub id.",
    )


class ThresholdIn(RequestBody):
    metric: str = Field(max_length=200, description="A metric the eval produces, e.g. eval/gsm8k.")
    op: Operator
    value: float = Field(allow_inf_nan=False)


class EvalCreate(RequestBody):
    name: str | None = Field(None, max_length=100, description="Default: eval-<model>.")
    team: str | None = Field(None, description="Admins: the team (name or id); default: yours.")
    model: EvalModel
    eval_prompt_data: list[_Path] | None = Field(
        None,
        min_length=2,
        max_length=64,
        description="Relax's --eval-prompt-data: name/path pairs, e.g. [gsm8k, artifacts://data/gsm8k.jsonl].",
    )
    eval_config: _Path | None = Field(
        None, description="Relax's --eval-config: a YAML/JSON file of eval sets; overrides eval_prompt_data."
    )
    n_samples_per_eval_prompt: int = Field(
        1, ge=1, le=1024, description="Samples per eval prompt (an eval-config entry may set its own)."
    )
    pass_at_k: bool | None = Field(
        None,
        description="Report eval/<name>-pass@k for k = 1, 2, 4, ... up to the samples per prompt (Relax's "
        "--log-passrate); default: when more than one sample per prompt.",
    )
    thresholds: list[Annotated[str, Field(max_length=300)] | ThresholdIn] = Field(
        min_length=1,
        max_length=100,
        description="Each `<metric> <op> <number>` (op >=, >, <=, <, ==), e.g. `eval/gsm8k >= 0.6`, or "
        "{metric, op, value}. The eval passes when every one holds.",
    )
    spec: dict[str, Any] | None = Field(
        None,
        max_length=64,
        description="More Relax parameters of the eval job: eval-*/rollout-* sampling, reward (rm-type, "
        "custom-rm-path, reward-key), data keys (input-key, label-key), chat template, seed, resource.",
    )
    queue: str | None = None
    priority_class: str | None = Field(
        None,
        description="Default: `eval`, the eval jobs' class (before the team's training jobs, within its "
        "quota; no grant needed). Or a class the team is granted, e.g. `low` for an eval that may wait.",
    )
    labels: Labels | None = None


class ThresholdPublic(BaseModel):
    metric: str
    op: Operator
    value: float
    actual: float | None = Field(None, description="The metric's value, once the eval ended.")
    verdict: Verdict = Field(description="missing: the job ended without reporting the metric.")


class EvalModelPublic(BaseModel):
    job: str | None = Field(None, description="The job evaluated (its id), if a job's.")
    checkpoint_step: int | None = Field(None, description="The step asked for.")
    step: int | None = Field(None, description="The step evaluated (a job's export or checkpoint).")
    path: str | None = Field(None, description="The model path asked for.")
    hf_checkpoint: str | None = Field(None, description="The folder it resolved to.")


class EvalDataset(BaseModel):
    name: str = Field(description="It names the metrics: eval/<name>, ...")
    path: str = Field(description="As given (eval_prompt_data), or as the eval-config file names it.")
    n_samples: int = Field(description="Samples per prompt.")
    config: str | None = Field(None, description="The eval-config file that names it.")


class EvalPublic(BaseModel):
    id: str
    name: str
    team_id: str
    job_id: str
    job_status: JobStatus | None = None
    outcome: EvalOutcome = Field(description="running until its job ends; then passed, failed or error.")
    reason: str | None
    model: EvalModelPublic
    model_key: str = Field(
        description="Names the model in its history (GET /v1/evals?model=...): `job:<id>` (each export and "
        "checkpoint of that job) or the path as given."
    )
    datasets: list[EvalDataset]
    thresholds: list[ThresholdPublic]
    metric_values: dict[str, float | None] = Field(description="The job's eval/* metrics, once it ended.")
    expected_metrics: list[str] = Field(description="The metrics the eval produces.")
    created_at: datetime
    finished_at: datetime | None
    created_by: str | None


class EvalsPage(BaseModel):
    data: list[EvalPublic]
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class WebhookEvalData(BaseModel):
    """What an `eval.completed` message says of the eval."""

    id: str
    name: str
    team: str = Field(description="The team's id.")
    job_id: str
    outcome: EvalOutcome
    reason: str | None
    model: EvalModelPublic
    model_key: str
    thresholds: list[ThresholdPublic]
    metric_values: dict[str, float | None]
    finished_at: datetime | None
