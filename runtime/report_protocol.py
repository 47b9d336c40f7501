"""The report protocol, declared once: what a job's driver sends the platform (`runtime/reporter.py` builds it), what
the API accepts (`POST /v1/internal/jobs/{id}/reports`, api/schemas/jobs.py) and what the platform stores from it,
over HTTP or from the driver's spool (scheduler/services/reports.py).

A report is one numbered batch (`Report`) of lists of items. Each item is a `TypedDict`: the driver builds it as a
plain dict (nothing to convert on the hot path, the JSON on the wire is the dict), and pydantic validates the same
declaration where it is received, with the bounds and defaults written here. A validated item holds every key (the
defaults filled in); keys this version does not know are ignored, so that a newer driver's reports are still taken.

Pure: pydantic and the standard library only (the API and the scheduler import it; it imports nothing of theirs).
"""

# No `from __future__ import annotations`: the TypedDicts' required keys are read when the class is made, and a
# string annotation hides `NotRequired` from it.
from enum import StrEnum
from typing import Annotated, NamedTuple, NotRequired, get_origin

from pydantic import BaseModel, ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic needs typing_extensions' TypedDict before Python 3.12

#: The integers a report carries, as the platform's columns hold them (scheduler/db/models.py): steps, ids and
#: counts in 32 bits, sizes in 64.
INTEGER_MIN, INTEGER_MAX = -(2**31), 2**31 - 1
BIGINT_MAX = 2**63 - 1

Integer = Annotated[int, Field(ge=INTEGER_MIN, le=INTEGER_MAX)]
Count = Annotated[int, Field(ge=0, le=INTEGER_MAX)]
#: Seconds since the epoch, up to the last second of year 9999 (what a datetime holds). Absent or null: the time
#: the platform stores the item.
Timestamp = Annotated[
    Annotated[float, Field(ge=0, le=253402300799, allow_inf_nan=False)] | None, Field(default=None)
]

_ITEM = ConfigDict(extra="ignore")


class Phase(StrEnum):
    RUNNING = "running"  # the roles are up; moves the job STARTING -> RUNNING


class EventKind(StrEnum):
    """The events the driver reports (an event's `kind` is free text: these are the ones it sends)."""

    MODEL_LOADED = "model_loaded"  # the roles loaded hf-checkpoint (and, on resume, the checkpoint)
    RESUMED = "resumed"  # training continues from a checkpoint under `load`
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_REMOVED = "checkpoint_removed"  # max-actor-ckpt-to-keep / rotate-ckpt let it go
    HF_EXPORTED = "hf_exported"
    PREDICTIONS_WRITTEN = "predictions_written"  # an SFT predictions file
    STOP_REQUESTED = "stop_requested"  # the platform asked the driver to stop between steps
    FINISHED = "finished"  # the loop ended normally
    FAILED = "failed"  # the driver is exiting on an error
    FINAL_REPORT = "final_report"  # in the driver's last report (Reporter.close): nothing follows it


class RolloutSplit(StrEnum):
    TRAIN = "train"
    EVAL = "eval"


@with_config(_ITEM)
class MetricItem(TypedDict):
    step: Integer
    name: str
    value: float  # a loss may be NaN or infinite: the driver reports what it measured
    time: NotRequired[Timestamp]


@with_config(_ITEM)
class LogItem(TypedDict):
    time: NotRequired[Timestamp]
    level: NotRequired[Annotated[str, Field(default="INFO")]]
    source: NotRequired[Annotated[str | None, Field(default=None)]]  # None: who sent it ("driver", "ray")
    message: NotRequired[Annotated[str, Field(default="")]]


@with_config(_ITEM)
class CheckpointItem(TypedDict):
    step: Integer
    path: str
    size_bytes: NotRequired[Annotated[int, Field(default=0, ge=0, le=BIGINT_MAX)]]
    format: NotRequired[Annotated[str, Field(default="torch", max_length=20)]]
    time: NotRequired[Timestamp]


@with_config(_ITEM)
class RolloutItem(TypedDict):
    rollout_id: Integer
    split: NotRequired[Annotated[str, Field(default=RolloutSplit.TRAIN.value, max_length=10)]]
    path: str
    num_samples: NotRequired[Annotated[int, Field(default=0, ge=0, le=INTEGER_MAX)]]
    time: NotRequired[Timestamp]


@with_config(_ITEM)
class PredictionItem(TypedDict):
    step: Integer
    path: str
    num_samples: NotRequired[Annotated[int, Field(default=0, ge=0, le=INTEGER_MAX)]]
    time: NotRequired[Timestamp]


@with_config(_ITEM)
class EventItem(TypedDict):
    time: NotRequired[Timestamp]
    kind: NotRequired[Annotated[str, Field(default="driver")]]  # an EventKind, or a source's own kind
    message: NotRequired[Annotated[str, Field(default="")]]


@with_config(_ITEM)
class Progress(TypedDict):
    """How far the run is: the step it reached and the steps it will take (either may be left out)."""

    step: NotRequired[Integer]
    total_steps: NotRequired[Integer]


@with_config(_ITEM)
class RolloutWish(TypedDict):
    """An elastic job's driver (`--autoscaler-config`) asks for this many rollout engines from now on, decided by its
    autoscaler YAML as a standalone run scales (`runtime.rollout.elastic.Autoscaler.ask`): the rollout's `share` of
    step `step`'s wall time (perf/rollout_time over perf/step_time) crossed `threshold` (above it scale_out's,
    below it scale_in's; None: the engines were brought within min_engines .. max_engines). The scheduling pass
    grows the job's rollout up to it and gives engines above it back (docs/reference/elastic-rollout.md)."""

    step: Integer
    engines: Annotated[int, Field(ge=1, le=INTEGER_MAX)]
    share: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    threshold: NotRequired[Annotated[float | None, Field(default=None, ge=0, le=1)]]


class Grant(NamedTuple):
    """What the answer to a report tells an elastic job's driver (`api.schemas.jobs.ReportAck`): the Ray node id of
    each rollout engine the scheduling pass allocates the job now (None: a node known by hostname only), and the
    grant's number, which the driver reports back as `Report.rollout_followed` once its engines match it."""

    engines: tuple[str | None, ...]
    number: int | None = None


class Report(BaseModel):
    """One batch from a job's driver: numbered per attempt from 0, resent unchanged until acknowledged."""

    attempt: Count
    seq: Count
    phase: str | None = None  # a Phase; another value is taken and changes nothing
    progress: Progress | None = None
    # the latest wish of an elastic job's driver since its last report (None: unchanged)
    rollout_wish: RolloutWish | None = None
    # an elastic job's driver runs the engines of this grant now (the answer's `rollout_grant`): the engines the pass
    # took back before it are stopped, and their GPUs free (None: unchanged)
    rollout_followed: Annotated[int, Field(ge=0, le=BIGINT_MAX)] | None = None
    metrics: list[MetricItem] = Field(default_factory=list)
    logs: list[LogItem] = Field(default_factory=list)
    checkpoints: list[CheckpointItem] = Field(default_factory=list)
    rollouts: list[RolloutItem] = Field(default_factory=list)
    predictions: list[PredictionItem] = Field(default_factory=list)
    events: list[EventItem] = Field(default_factory=list)


#: A report's lists of items, in the order the driver fills and the platform applies them.
REPORT_LISTS: tuple[str, ...] = tuple(
    name for name, field in Report.model_fields.items() if get_origin(field.annotation) is list
)
