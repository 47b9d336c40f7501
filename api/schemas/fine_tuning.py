"""OpenAI's fine-tuning jobs (`/v1/fine_tuning/jobs`; docs/reference/fine-tuning.md): the request and the
objects in OpenAI's shapes (ids, `object`, unix-second times), so the official `openai` SDK parses them, and its
error shape (`{"error": {message, type, param, code}}`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from api.schemas import ErrorEnvelope, RequestBody, error_responses
from scheduler.services.fine_tuning import FineTuningJobStatus

Auto = Literal["auto"]
BatchSize = Auto | Annotated[int, Field(ge=1, le=4096)]
Epochs = Auto | Annotated[int, Field(ge=1, le=50)]
Multiplier = Auto | Annotated[float, Field(gt=0, le=100)]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class SupervisedHyperparameters(RequestBody):
    batch_size: BatchSize = "auto"
    learning_rate_multiplier: Multiplier = "auto"
    n_epochs: Epochs = "auto"


class ReinforcementHyperparameters(SupervisedHyperparameters):
    compute_multiplier: Multiplier = Field(
        "auto", description="Scales the samples per prompt (4 at 1.0, at least 2)."
    )
    eval_interval: Auto | Annotated[int, Field(ge=1, le=100_000)] = "auto"
    eval_samples: Auto | Annotated[int, Field(ge=1, le=64)] = "auto"
    reasoning_effort: Literal["default", "low", "medium", "high"] = Field(
        "default", description="The responses' token budget: low 256, default/medium 1024, high 4096."
    )


class DpoHyperparameters(SupervisedHyperparameters):
    beta: Auto | Annotated[float, Field(gt=0, le=2)] = "auto"


class SupervisedMethod(RequestBody):
    hyperparameters: SupervisedHyperparameters | None = None


class ReinforcementMethod(RequestBody):
    grader: dict[str, Any] = Field(
        description="OpenAI's grader: string_check (eq, ne, like, ilike) or text_similarity (fuzzy_match) run "
        "here; input {{sample.output_text}}, reference {{item.<field>}}."
    )
    hyperparameters: ReinforcementHyperparameters | None = None


class DpoMethod(RequestBody):
    hyperparameters: DpoHyperparameters | None = None


class FineTuningMethod(RequestBody):
    type: Literal["supervised", "reinforcement", "dpo"]
    supervised: SupervisedMethod | None = None
    reinforcement: ReinforcementMethod | None = None
    dpo: DpoMethod | None = None


class FineTuningJobCreate(RequestBody):
    model: str = Field(
        max_length=1000,
        description="An uploaded model (file id, purpose model), an artifacts:// path, or a fine_tuned_model "
        "this API returned.",
    )
    training_file: str = Field(max_length=60, description="A file of purpose fine-tune: JSONL chat rows.")
    validation_file: str | None = Field(None, max_length=60)
    suffix: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9._-]*$")
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = None
    method: FineTuningMethod | None = Field(None, description="Defaults to supervised.")
    hyperparameters: SupervisedHyperparameters | None = Field(
        None, description="Legacy: the supervised method's hyperparameters."
    )
    integrations: list[dict[str, Any]] | None = Field(
        None, max_length=0, description="Not taken: use the job's trackers through /v1/jobs."
    )
    team: str | None = Field(
        None, max_length=100, description="Admins: the team (name or id); a team's key: its own, or none."
    )


class FineTuningJobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningJobHyperparameters(BaseModel):
    batch_size: BatchSize | None = None
    learning_rate_multiplier: Multiplier | None = None
    n_epochs: Epochs | None = None


class FineTuningJob(BaseModel):
    id: str = Field(description="The platform job's id (GET /v1/jobs/{id} shows it whole).")
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: FineTuningJobError | None = None
    fine_tuned_model: str | None = Field(
        None, description="ft:<base>:<team>:<suffix>:<job id> once succeeded; a model for a next job."
    )
    finished_at: int | None = None
    hyperparameters: FineTuningJobHyperparameters
    model: str
    organization_id: str = Field(description="The team's id.")
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: FineTuningJobStatus
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: None = Field(None, description="None here: integrations are not taken.")
    metadata: dict[str, str] | None = None
    method: FineTuningMethod | None = Field(None, description="As created, its `auto` values resolved.")


class FineTuningJobsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] | None = None


class FineTuningJobEventsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool


class FineTuningCheckpointMetrics(BaseModel):
    step: float | None = None
    train_loss: float | None = None
    train_mean_token_accuracy: float | None = None
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None
    full_valid_loss: float | None = None
    full_valid_mean_token_accuracy: float | None = None


class FineTuningJobCheckpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: FineTuningCheckpointMetrics
    step_number: int


class FineTuningJobCheckpointsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobCheckpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class OpenAIErrorBody(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, permission_error, ...")
    param: str | None = Field(description="The request's field at fault (e.g. training_file, method.type).")
    code: str | None
    details: Any = None
    request_id: str | None = None


class OpenAIErrorEnvelope(BaseModel):
    """The error shape of OpenAI's API, on the /v1/fine_tuning routes."""

    error: OpenAIErrorBody


OPENAI_ERROR_RESPONSES = {
    **error_responses(
        OpenAIErrorEnvelope,
        {
            400: "Invalid request; error.param names the field.",
            401: "Missing or unknown API key.",
            403: "The key may not do this.",
            404: "No such job (or not visible to the key).",
            409: "Conflicts with the job's state.",
        },
    ),
    **error_responses(
        ErrorEnvelope,
        {
            413: "The request body is over the API's limit (answered before the route, in the platform's own "
            "error shape).",
            422: "A NUL character or a non-finite number in the request, refused before the route (in the "
            "platform's own error shape); every other refusal is a 400 here.",
        },
    ),
    **error_responses(OpenAIErrorEnvelope, {503: "The database or the broker is unavailable."}),
}
