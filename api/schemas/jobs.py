"""Job request and response schemas."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from api.schemas import Labels, RequestBody
from jobspec.bounds import MAX_ARGV_WORDS, MAX_PATH_LENGTH, MAX_SPEC_KEYS, MAX_WORD_LENGTH
from jobspec.demand import ResourceDemand
from jobspec.issues import SpecIssue
from scheduler.db.models import INTEGER_MAX
from scheduler.domain.jobs import FailureReason, JobStatus

# The wire types of the responses are the domain's own declarations (docs/adr/0008): a job's status and
# failure reason are `scheduler.domain.jobs`'s enums (OpenAPI lists their values), its demand is
# `jobspec.demand.ResourceDemand` and a spec issue `jobspec.issues.SpecIssue`.


LAUNCH_SCRIPT_TEXT_MAX = 256 * 1024  # bytes of UTF-8
_LAUNCH_SCRIPT_JSON_MAX = 64 * 1024  # bytes of the JSON of env, script_args, runtime_env
_Path = Annotated[str, Field(max_length=MAX_PATH_LENGTH)]
#: A spec object: at most as many keys as jobspec reads (jobspec/bounds.py), refused here before it is judged.
SpecObject = Annotated[dict[str, Any], Field(max_length=MAX_SPEC_KEYS)]
#: Relax flags as a list (each item one command-line word) or as one shell-quoted string.
Argv = (
    Annotated[list[Annotated[str, Field(max_length=MAX_WORD_LENGTH)]], Field(max_length=MAX_ARGV_WORDS)] | str
)


class LaunchScriptIn(RequestBody):
    """Where a job's `args` came from when `relaxctl` resolved a Relax launch script on the client
    (docs/adr/0004). Provenance only: the server never runs it; the job keeps it under
    `submitted.launch_script`."""

    path: _Path = Field(description="The script's absolute path on the submitting machine.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the script file as read.")
    text: str = Field(
        "", description="The script's text (secret-looking assignments redacted), at most 256 KiB."
    )
    text_truncated: bool = False
    env: dict[Annotated[str, Field(max_length=256)], str] = Field(
        default_factory=dict, description="The --env pairs given, secret-looking values replaced by ***."
    )
    script_args: list[str] = Field(default_factory=list, max_length=1000)
    file: _Path | None = Field(
        None, description="The file (the script or one it sources) of the training command."
    )
    line: int | None = Field(None, ge=1, le=INTEGER_MAX, description="Its line.")
    entrypoint: str | None = Field(
        None, max_length=4096, description="e.g. `python3 -m relax.entrypoints.train`."
    )
    launcher: Literal["python", "torchrun", "ray job submit"] | None = None
    runtime_env: dict[str, Any] | None = Field(
        None, description="`ray job submit --runtime-env-json`, parsed."
    )
    working_dir: _Path | None = Field(None, description="`ray job submit --working-dir`.")
    submission_id: str | None = Field(None, max_length=200, description="`ray job submit --submission-id`.")

    @field_validator("text")
    @classmethod
    def _text_size(cls, v: str) -> str:
        if len(v.encode()) > LAUNCH_SCRIPT_TEXT_MAX:
            raise ValueError(f"at most {LAUNCH_SCRIPT_TEXT_MAX} bytes (the client truncates longer scripts)")
        return v

    @field_validator("env", "script_args", "runtime_env")
    @classmethod
    def _json_size(cls, v: Any) -> Any:
        if v is not None and len(json.dumps(v)) > _LAUNCH_SCRIPT_JSON_MAX:
            raise ValueError(f"at most {_LAUNCH_SCRIPT_JSON_MAX} bytes as JSON")
        return v


#: The launch script a request's `args` were resolved from (`_LaunchScriptWithArgs` checks it comes with them).
LaunchScriptOpt = Annotated[
    LaunchScriptIn | None,
    Field(description="With `args`: the launch script they were resolved from on the client (provenance)."),
]


class _LaunchScriptWithArgs(RequestBody):
    """A request with `spec`, `args` and `launch_script`: the launch script comes only with `args`."""

    @model_validator(mode="after")
    def _launch_script_with_args(self) -> Any:
        model: Any = self  # the subclass declares the fields
        if model.launch_script is not None and (model.args is None or model.spec is not None):
            raise ValueError("launch_script comes with `args` (the flags resolved from it), not with `spec`")
        return self


class JobCreate(_LaunchScriptWithArgs):
    """Submit a job: the Relax config as an object (`spec`) or as Relax CLI flags (`args`)."""

    name: str | None = Field(
        None,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Job name; other jobs refer to its outputs as job://<name>/<path>.",
    )
    team: str | None = Field(None, description="Team name or id (default: the key's team).")
    queue: str | None = Field(None, description="Queue name (default: the team's first queue).")
    priority_class: str | None = Field(
        None,
        validation_alias=AliasChoices("priority_class", "priority-class"),
        description="Priority class (default `normal`): orders jobs within a queue; some are not preemptible.",
    )
    labels: Labels = Field(default_factory=dict)
    spec: SpecObject | None = Field(
        None,
        description="Relax parameters, keys as in the reference ('rollout-batch-size' or 'rollout_batch_size').",
    )
    args: Argv | None = Field(
        None,
        description="Relax CLI flags, as a list or one shell-quoted string: ['--rollout-batch-size', '8', ...].",
    )
    launch_script: LaunchScriptOpt = None


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    team_id: str
    queue: str
    pool: str
    status: JobStatus
    status_reason: str | None = Field(description="Why the job is in its status (for FAILED: the error).")
    failure_reason: FailureReason | None
    priority_class: str
    priority: int
    preemptible: bool
    queue_position: int | None
    wait_reason: str | None
    labels: dict[str, str]
    total_gpus: int
    attempt: int
    preemptions: int
    progress_step: int | None
    total_steps: int | None
    output_dir: str
    ray_submission_id: str | None
    created_at: datetime
    updated_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_report_at: datetime | None


class AllocationPublic(BaseModel):
    """GPUs of one node held by one role of the job (a row of `scheduler.db.models.Allocation`; a colocated
    role riding on its host's GPUs is listed too)."""

    model_config = ConfigDict(from_attributes=True)

    node: str
    role: str
    gpus: int
    pool: str
    releasing: bool = Field(
        False,
        description="A rollout engine the scheduling pass took back from the (elastic) job that its driver has not "
        "yet stopped: its GPUs stay held until then (docs/reference/elastic-rollout.md).",
    )


class JobDetail(JobPublic):
    # an assignment is validated too: the route fills `allocations` after the job is read
    model_config = ConfigDict(from_attributes=True, validate_assignment=True)

    spec: dict[str, Any] = Field(description="The normalized spec: every Relax parameter, paths resolved.")
    submitted: dict[str, Any] = Field(
        description="What was submitted (`spec`, or `args` and `launch_script`) and what the submission "
        "found: the spec's `warnings`, the values the rules `derived`, the jobs it reads (`inputs`)."
    )
    demand: ResourceDemand
    allocations: list[AllocationPublic] = Field(default_factory=list)


class JobsPage(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class JobEventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    time: datetime
    kind: str
    from_status: JobStatus | None
    to_status: JobStatus | None
    reason: str | None


class JobEventsPage(BaseModel):
    data: list[JobEventPublic]


class MetricPoint(BaseModel):
    step: int
    value: float
    time: datetime
    attempt: int = Field(
        description="The attempt whose driver produced it: a resumed attempt trains again the steps after "
        "its checkpoint, so a step can have one point per attempt."
    )


class JobMetrics(BaseModel):
    job_id: str
    series: dict[str, list[MetricPoint]]


class LogLinePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    time: datetime
    level: str
    source: str
    message: str


class LogsPage(BaseModel):
    data: list[LogLinePublic]
    next_after: int = Field(description="Pass as `after` to get the lines that follow.")


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    step: int
    path: str
    size_bytes: int
    format: str
    time: datetime


class CheckpointsPage(BaseModel):
    data: list[CheckpointPublic]


class RolloutPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    rollout_id: int
    split: str
    path: str
    num_samples: int
    time: datetime


class RolloutsPage(BaseModel):
    data: list[RolloutPublic]


class PredictionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    step: int
    path: str
    num_samples: int
    time: datetime


class PredictionsPage(BaseModel):
    data: list[PredictionPublic]


class SpecValidate(_LaunchScriptWithArgs):
    spec: SpecObject | None = None
    args: Argv | None = None
    queue: str | None = None
    team: str | None = None
    launch_script: LaunchScriptOpt = None


class PoolFit(BaseModel):
    """A pool taken empty, with every node it has (cordoned and down nodes too: they may come back)."""

    name: str
    gpus: int
    nodes: int
    largest_node: int = Field(description="GPUs of its largest node.")
    fits: bool | None = Field(description="Whether the demand could be placed; null: the pool has no nodes.")


class Capacity(BaseModel):
    """Whether a demand could ever be placed, in the job's pool and in the largest pool."""

    needs_gpus: int
    pool: PoolFit
    largest_pool: PoolFit
    fits_some_pool: bool


class SpecValidation(BaseModel):
    """The dry run's answer. Every key is present whatever the outcome; with errors, `spec`, `argv`,
    `derived` and `demand` describe what was understood (null when not even that is known)."""

    valid: bool = Field(description="Whether a submit of the same request would be accepted.")
    spec: dict[str, Any] | None = Field(None, description="The normalized spec: every field, paths resolved.")
    argv: list[str] | None = Field(None, description="The resolved Relax argv (non-default values).")
    derived: dict[str, Any] = Field(
        default_factory=dict, description="Values Relax derives (its rules, its Megatron defaults)."
    )
    warnings: list[SpecIssue] = Field(default_factory=list, description="Issues of severity warning.")
    errors: list[SpecIssue] = Field(default_factory=list, description="Issues of severity error.")
    demand: ResourceDemand | None = Field(None, description="GPU groups per role, total GPUs, nodes needed.")
    capacity: Capacity | None = Field(
        None,
        description="Whether the demand could ever be placed: in the job's pool (`pool.fits`), in the largest "
        "pool, and in some pool (`fits_some_pool`); `fits` is null for a pool with no nodes yet.",
    )
    queue: str | None = None
    pool: str | None = None


# A driver's report (`POST /v1/internal/jobs/{id}/report`) is the report protocol's own declaration,
# `runtime.report_protocol.Report` and its items: the driver builds it, the route takes it, the service stores it.


class GrantedEngine(BaseModel):
    """One rollout engine of an elastic job as the scheduling pass allocated it: its node, and that node's Ray id
    (null: a node known by hostname only)."""

    node: str
    ray_node_id: str | None = None


class ReportAck(BaseModel):
    stop_requested: bool
    rollout_engines: list[GrantedEngine] | None = Field(
        None,
        description="An elastic job's rollout engines (--autoscaler-config) as the scheduling pass allocated them "
        "now, one per engine in replica order: the driver stops and starts engines between steps to match "
        "(docs/reference/elastic-rollout.md). Absent for any other job.",
    )
    rollout_grant: int | None = Field(
        None,
        description="The number of that grant (it grows with each one): once the driver's engines match it, the "
        "driver reports it as `rollout_followed`, and the GPUs of engines the pass took back before it are free. "
        "Absent for any other job.",
    )
