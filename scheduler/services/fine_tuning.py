"""OpenAI's fine-tuning API over our jobs (`/v1/fine_tuning/jobs`; docs/reference/fine-tuning.md).

Each fine-tuning job IS one of our jobs, submitted through the job submission service (`JobSubmission.judge`
then `submit`: the team's queue, class, paths and limits as any job's) with the label `fine_tuning` (its
method) and what the caller sent kept in the job's `submitted["openai_fine_tuning"]`:

- `supervised` -> Relax SFT (`loss-type: sft`) on the training file's chat rows (`input-key: messages`: the
  runtime reads OpenAI messages itself, every assistant turn trained; runtime/data/sft.py);
- `reinforcement` -> GRPO with the reward of its grader: `string_check` (eq, ne, like, ilike) and
  `text_similarity` with `fuzzy_match` (runtime/rewards/graders.py, by `custom-rm-path`); other graders and
  metrics are refused naming the field, with what to use instead;
- `dpo` -> refused (no preference-pair trainer here).

The files are checked before anything is written: each is the team's, of purpose `fine-tune`, and every line a
JSON object with a `messages` list in OpenAI's chat format (supervised: with an assistant turn; reinforcement:
with the reference field its grader names). A refusal names the request's field (`training_file`,
`method.type`, `method.reinforcement.grader.type`, ...) and writes nothing.

Who may: as for jobs (creating is `Action.JOB_SUBMIT`, cancelling `JOB_CANCEL`, reading `JOB_READ`); another
team's job or file is answered as missing.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Checkpoint, Job, JobEvent, Metric, StoredFile, Team
from scheduler.domain.errors import InvalidRequest, InvalidSpec, NotFound
from scheduler.domain.jobs import JobStatus
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_for
from scheduler.services.files import FILE_SCHEME, Files
from scheduler.services.paths import JOB
from scheduler.services.submission import Submission, judge_and_submit

#: The label that marks a job made by this API (its value: the method's type).
LABEL = "fine_tuning"
#: Where the job's `submitted` keeps the OpenAI request (as resolved: hyperparameters, seed).
SUBMITTED_KEY = "openai_fine_tuning"
METHODS = ("supervised", "reinforcement", "dpo")
ROLES = ("system", "developer", "user", "assistant", "tool")
FT_PREFIX = "ft:"
#: Base learning rates that `learning_rate_multiplier` multiplies.
BASE_LR = {"supervised": 1.0e-5, "reinforcement": 1.0e-6}
#: `auto` values.
AUTO_BATCH_SIZE = 8
AUTO_EPOCHS = {"supervised": 3, "reinforcement": 1}
AUTO_SAMPLES_PER_PROMPT = 4
#: `reasoning_effort` -> rollout-max-response-len.
RESPONSE_LEN = {"low": 256, "default": 1024, "medium": 1024, "high": 4096}
#: The rewards of graders (runtime/rewards/graders.py), by (type, operation or evaluation metric).
GRADER_REWARDS = {
    ("string_check", "eq"): "runtime.rewards.graders.string_check_eq",
    ("string_check", "ne"): "runtime.rewards.graders.string_check_ne",
    ("string_check", "like"): "runtime.rewards.graders.string_check_like",
    ("string_check", "ilike"): "runtime.rewards.graders.string_check_ilike",
    ("text_similarity", "fuzzy_match"): "runtime.rewards.graders.fuzzy_match",
}
#: `ft:<base>:<team>:<suffix>:<job id>[:ckpt-step-<N>]`: a fine-tuned model, or one of its checkpoints.
_FT_MODEL = re.compile(r"ft:.{0,300}:(job_[0-9a-z]{1,40})(?::ckpt-step-([1-9][0-9]{0,8}))?")
_SAMPLE_TEXT = re.compile(r"\{\{\s*sample\.output_text\s*\}\}")
_ITEM_FIELD = re.compile(r"\{\{\s*item\.([A-Za-z_][A-Za-z0-9_]{0,99})\s*\}\}")
#: At most this many lines of a file are checked.
MAX_CHECKED_ROWS = 1_000_000
MAX_LINE_BYTES = 4 * 1024 * 1024


def invalid(param: str, message: str, hint: str, code: str = "fine_tuning.invalid") -> InvalidRequest:
    """A refusal naming the request's field (OpenAI's `param`)."""
    return InvalidRequest.naming(param, message, hint, code=code)


@dataclass
class FineTuningRequest:
    """A validated `POST /v1/fine_tuning/jobs` body (the API schema converts to this); `method` as OpenAI's
    `{type, supervised|reinforcement|dpo: {hyperparameters, grader}}`, plain JSON."""

    model: str
    training_file: str
    validation_file: str | None = None
    suffix: str | None = None
    seed: int | None = None
    metadata: dict[str, str] | None = None
    method: dict[str, Any] | None = None
    hyperparameters: dict[str, Any] | None = None  # the legacy top-level ones (supervised)
    team: str | None = None  # admins: the team (name or id)


@dataclass(frozen=True)
class CheckedFile:
    id: str
    rows: int
    path: str  # file://<id>


# -- creating --------------------------------------------------------------------------------------------------
def create_job(
    session: Session,
    principal: Principal,
    req: FineTuningRequest,
    *,
    files: Files,
    artifact_root: Path,
    home: Path,
    read_session: Session | None = None,
) -> Job:
    """Check the request and its files, submit the job (a refusal writes nothing), keep the request with it.
    Everything is checked and the spec judged in `read_session` when given (`files` reads there too), then
    written in `session`."""
    principal.require(Action.JOB_SUBMIT)
    reads = read_session if read_session is not None else session
    team = team_for(reads, principal, req.team)
    method = dict(req.method or {"type": "supervised"})
    kind = method.get("type")
    if kind not in METHODS:
        raise invalid(
            "method.type",
            f"unknown fine-tuning method {str(kind)[:40]!r}",
            "one of supervised (SFT) or reinforcement (GRPO with the grader's reward)",
        )
    if kind == "dpo":
        raise invalid(
            "method.type",
            "the dpo method is not supported here",
            "use supervised (SFT) or reinforcement (GRPO), or submit a Relax job through /v1/jobs",
            code="fine_tuning.unsupported_method",
        )
    params = method.get(kind) or {}
    if req.hyperparameters and params.get("hyperparameters"):
        raise invalid(
            "hyperparameters",
            "hyperparameters given twice: top-level and in method",
            f"give them in method.{kind}.hyperparameters only",
        )
    hyper = dict(params.get("hyperparameters") or req.hyperparameters or {})
    if req.hyperparameters and kind != "supervised":
        raise invalid(
            "hyperparameters",
            "the top-level hyperparameters are the supervised method's",
            f"give them in method.{kind}.hyperparameters",
        )
    label_key = None
    reward: dict[str, Any] = {}
    if kind == "reinforcement":
        reward, label_key = _grader(params.get("grader"))
    base, hf_checkpoint = _model(reads, team, req.model)
    train = _check_file(files, principal, team, req.training_file, "training_file", kind, label_key)
    valid = (
        _check_file(files, principal, team, req.validation_file, "validation_file", kind, label_key)
        if req.validation_file
        else None
    )
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
    resolved, spec = _spec(kind, hyper, train, valid, hf_checkpoint, seed, reward, label_key)
    suffix = req.suffix or ""
    sub = Submission(
        name=(f"ft-{suffix}" if suffix else f"ft-{kind}")[:100],
        team=req.team,
        labels={LABEL: kind},
        spec=spec,
    )
    try:
        job = judge_and_submit(session, reads, principal, sub, artifact_root=artifact_root, home=home)
    except InvalidSpec as err:
        raise _renamed(err, kind) from err
    method_out: dict[str, Any] = {"type": kind, kind: {"hyperparameters": resolved}}
    if kind == "reinforcement":
        method_out[kind]["grader"] = params.get("grader")
    kept = {
        "model": req.model,
        "base": base,
        "training_file": req.training_file,
        "validation_file": req.validation_file,
        "suffix": req.suffix,
        "seed": seed,
        "metadata": req.metadata,
        "method": method_out,
        "hyperparameters": {k: resolved[k] for k in ("batch_size", "learning_rate_multiplier", "n_epochs")},
        "team_name": team.name,
        "rows": train.rows,
    }
    submitted = {**(job.submitted or {}), SUBMITTED_KEY: kept}
    session.execute(sa.update(Job).where(Job.id == job.id).values(submitted=submitted))
    job.submitted = submitted
    return job


def _grader(grader: Any) -> tuple[dict[str, Any], str]:
    """(the reward's spec values, the row field that holds the reference) for a grader, or a refusal."""
    at = "method.reinforcement.grader"
    hint = (
        "graders run here: string_check (eq, ne, like, ilike) and text_similarity with fuzzy_match; for "
        "another reward, submit a GRPO job through /v1/jobs with rm-type or custom-rm-path"
    )
    if not isinstance(grader, dict):
        raise invalid(at, "the reinforcement method needs a grader", hint)
    gtype = grader.get("type")
    if gtype not in ("string_check", "text_similarity"):
        raise invalid(
            f"{at}.type",
            f"the {str(gtype)[:40]!r} grader is not supported",
            hint,
            code="fine_tuning.unsupported_grader",
        )
    op_field = "operation" if gtype == "string_check" else "evaluation_metric"
    op = grader.get(op_field)
    path = GRADER_REWARDS.get((gtype, op))
    if path is None:
        raise invalid(
            f"{at}.{op_field}",
            f"{gtype} with {op_field} {str(op)[:40]!r} is not supported",
            hint,
            code="fine_tuning.unsupported_grader",
        )
    if not isinstance(grader.get("input"), str) or not _SAMPLE_TEXT.fullmatch(grader["input"].strip()):
        raise invalid(
            f"{at}.input",
            "the grader's input must be the sample's text",
            "input: {{sample.output_text}}",
        )
    ref = grader.get("reference")
    found = _ITEM_FIELD.fullmatch(ref.strip()) if isinstance(ref, str) else None
    if found is None:
        raise invalid(
            f"{at}.reference",
            "the grader's reference must be one field of the training row",
            "reference: {{item.<field>}}, e.g. {{item.reference_answer}}",
        )
    return {"custom_rm_path": path}, found.group(1)


def _model(session: Session, team: Team, model: str) -> tuple[str, str]:
    """(the base model's short name, the spec's hf-checkpoint) for `model`: a file of purpose model
    (`file-...` or `file://<id>`), an `artifacts://` path, or a fine-tuned model (or one of its checkpoints,
    `...:ckpt-step-<N>`) this API returned."""
    hint = (
        "a model your team may read: an uploaded file id (purpose model), an artifacts:// path "
        "(e.g. artifacts://models/tiny), or the fine_tuned_model of one of your succeeded jobs"
    )
    if model.startswith(FT_PREFIX):
        found = _FT_MODEL.fullmatch(model)
        job = session.get(Job, found.group(1)) if found else None
        if job is None or job.team_id != team.id or LABEL not in (job.labels or {}):
            raise invalid(
                "model", f"no fine-tuned model {model[:200]!r} of your team", hint, "model_not_found"
            )
        assert found is not None
        step = int(found.group(2)) - 1 if found.group(2) else None  # steps done -> the runtime's step
        export = _export(session, job, step=step)
        if export is None or (step is None and job.status != JobStatus.SUCCEEDED):
            what = f"no checkpoint of step {step + 1}" if step is not None else f"status {job.status}"
            raise invalid(
                "model",
                f"job {job.id} has not produced this model ({what})",
                hint + "; a checkpoint: a fine_tuned_model_checkpoint of its checkpoints list",
                "model_not_found",
            )
        base = str((job.submitted or {}).get(SUBMITTED_KEY, {}).get("base") or "model")
        return base, f"{JOB}{job.id}/{export}"
    if model.startswith(FILE_SCHEME) or re.fullmatch(r"file[-_][A-Za-z0-9]{1,40}", model):
        file_id = model.removeprefix(FILE_SCHEME).split("/", 1)[0]
        row = session.get(StoredFile, file_id) if len(file_id) <= 40 else None
        if row is None or row.team_id != team.id:
            raise invalid("model", f"no file {file_id[:60]!r} of your team", hint, "model_not_found")
        if row.purpose != "model":
            raise invalid(
                "model", f"file {file_id} has purpose {row.purpose!r}, not model", hint, "model_not_found"
            )
        return row.id, model if model.startswith(FILE_SCHEME) else f"{FILE_SCHEME}{row.id}"
    if model.startswith(("artifacts://", JOB)):
        name = model.rstrip("/").rsplit("/", 1)[-1]
        return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60] or "model", model
    raise invalid("model", f"{model[:200]!r} is not a model here", hint, "model_not_found")


def _export(session: Session, job: Job, *, step: int | None = None) -> str | None:
    """The job's newest Hugging Face export (`step`: that step's export, else the model folder of that step's
    checkpoint), as a path under its output folder; None when there is none."""
    q = sa.select(Checkpoint.path, Checkpoint.format).where(Checkpoint.job_id == job.id)
    q = q.where(Checkpoint.format == "hf") if step is None else q.where(Checkpoint.step == step)
    rows = session.execute(q.order_by(Checkpoint.step.desc(), Checkpoint.id.desc())).all()
    chosen = next((r for r in rows if r.format == "hf"), None) or next(iter(rows), None)
    if chosen is None:
        return None
    folder = Path(chosen.path) if chosen.format == "hf" else Path(chosen.path) / "model"
    try:
        return folder.relative_to(job.output_dir).as_posix()
    except ValueError:
        return None


def _lines(files: Files, row: StoredFile) -> Iterator[bytes]:
    """The file's lines, each at most MAX_LINE_BYTES + 1 bytes (a longer one is cut there, and refused)."""
    store = files.store
    local = store.local_path(row.key) if store.name == row.store else None
    if local is not None:
        with open(local, "rb") as fh:
            while line := fh.readline(
                MAX_LINE_BYTES + 1
            ):  # a line over the bound is refused, never held whole
                yield line
        return
    from scheduler.services.filestore import store_for

    if store.name != row.store:
        store = store_for(files.settings, files.artifact_root)
    pending = b""
    for chunk in store.read(row.key, 0, row.bytes):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line + b"\n"
        if len(pending) > MAX_LINE_BYTES:
            yield pending
            pending = b""
    if pending:
        yield pending


def _check_file(
    files: Files,
    principal: Principal,
    team: Team,
    file_id: str,
    param: str,
    kind: str,
    label_key: str | None,
) -> CheckedFile:
    """The file, checked: the team's, purpose fine-tune, every line a chat row the method can train on."""
    hint = (
        "upload a JSONL file with purpose fine-tune (client.files.create(file=..., purpose='fine-tune')), "
        'one {"messages": [{"role": ..., "content": ...}, ...]} object a line'
    )
    ref = file_id.removeprefix(FILE_SCHEME)
    try:
        row = files.get(principal, ref)
    except NotFound:
        row = None
    if row is None or row.team_id != team.id:
        raise invalid(param, f"no file {file_id[:60]!r} of your team", hint, "fine_tuning.file_not_found")
    if row.purpose != "fine-tune":
        raise invalid(
            param,
            f"file {row.id} has purpose {row.purpose!r}, not fine-tune",
            hint,
            "fine_tuning.bad_purpose",
        )
    rows = 0
    try:
        for n, raw in enumerate(_lines(files, row), 1):
            if not raw.strip():
                continue
            if n > MAX_CHECKED_ROWS:
                break
            problem = _row_problem(raw, kind, label_key)
            if problem:
                raise invalid(param, f"file {row.id}, line {n}: {problem}", hint, "fine_tuning.bad_file")
            rows += 1
    except OSError as err:
        raise invalid(
            param, f"file {row.id} cannot be read: {type(err).__name__}", hint, "fine_tuning.bad_file"
        ) from err
    if rows == 0:
        raise invalid(param, f"file {row.id} has no rows", hint, "fine_tuning.bad_file")
    return CheckedFile(row.id, rows, f"{FILE_SCHEME}{row.id}")


def _row_problem(raw: bytes, kind: str, label_key: str | None) -> str | None:
    if len(raw) > MAX_LINE_BYTES:
        return f"a line over {MAX_LINE_BYTES} bytes"
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return "not JSON"
    if not isinstance(doc, dict):
        return "not a JSON object"
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no `messages` list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"messages[{i}] has no role of {', '.join(ROLES)}"
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
            if isinstance(content, list) and all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
            ):
                continue
            return f"messages[{i}].content is not text"
    roles = [m["role"] for m in messages]
    if kind == "supervised" and "assistant" not in roles:
        return "no assistant message to train on"
    if kind == "reinforcement":
        if roles[-1] == "assistant":
            return "the last message is the assistant's: a reinforcement row is the prompt only"
        if label_key is not None and doc.get(label_key) is None:
            return f"no `{label_key}` field (the grader's reference)"
    return None


def _number(hyper: dict[str, Any], name: str, auto: Any) -> Any:
    value = hyper.get(name, "auto")
    return auto if value in (None, "auto") else value


def _spec(
    kind: str,
    hyper: dict[str, Any],
    train: CheckedFile,
    valid: CheckedFile | None,
    hf_checkpoint: str,
    seed: int,
    reward: dict[str, Any],
    label_key: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the hyperparameters as resolved, the Relax spec)."""
    batch = int(_number(hyper, "batch_size", min(AUTO_BATCH_SIZE, train.rows)))
    if batch > train.rows:
        raise invalid(
            f"method.{kind}.hyperparameters.batch_size",
            f"batch_size {batch} is larger than the training file ({train.rows} rows)",
            f"at most {train.rows}, or auto",
        )
    epochs = int(_number(hyper, "n_epochs", AUTO_EPOCHS[kind]))
    multiplier = float(_number(hyper, "learning_rate_multiplier", 1.0))
    steps_per_epoch = max(1, train.rows // batch)
    resolved: dict[str, Any] = {
        "batch_size": batch,
        "learning_rate_multiplier": multiplier,
        "n_epochs": epochs,
    }
    spec: dict[str, Any] = {
        "train-backend": "torch",
        "hf-checkpoint": hf_checkpoint,
        "prompt-data": train.path,
        "input-key": "messages",
        "rollout-shuffle": True,
        "rollout-batch-size": batch,
        "num-epoch": epochs,
        "lr": BASE_LR[kind] * multiplier,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
        "seed": seed,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": "ckpt",
        "save-interval": steps_per_epoch,
        "save-hf": "hf",
    }
    if kind == "supervised":
        spec |= {
            "loss-type": "sft",
            "global-batch-size": batch,
            "use-dynamic-batch-size": True,
            "max-tokens-per-gpu": 4096,
            "sft-oversize-strategy": "truncate_left",
        }
        if valid is not None:
            spec |= {"eval-prompt-data": ["validation", valid.path], "eval-interval": steps_per_epoch}
        return resolved, spec
    compute = float(_number(hyper, "compute_multiplier", 1.0))
    samples = max(2, round(AUTO_SAMPLES_PER_PROMPT * compute))
    effort = hyper.get("reasoning_effort") or "default"
    resolved |= {
        "compute_multiplier": compute,
        "reasoning_effort": effort,
        "eval_interval": int(_number(hyper, "eval_interval", steps_per_epoch)),
        "eval_samples": int(_number(hyper, "eval_samples", 1)),
    }
    spec |= {
        **{k.replace("_", "-"): v for k, v in reward.items()},
        "label-key": label_key,
        "apply-chat-template": True,
        "advantage-estimator": "grpo",
        "n-samples-per-prompt": samples,
        "global-batch-size": batch * samples,
        "rollout-max-response-len": RESPONSE_LEN[effort],
        "rollout-temperature": 1.0,
        "colocate": True,
    }
    if valid is not None:
        spec |= {
            "eval-prompt-data": ["validation", valid.path],
            "eval-interval": resolved["eval_interval"],
            "n-samples-per-eval-prompt": resolved["eval_samples"],
        }
    return resolved, spec


def _renamed(err: InvalidSpec, kind: str) -> InvalidSpec:
    """The submission's refusal, with the spec's fields named as this request names them."""
    own = {
        "hf-checkpoint": "model",
        "prompt-data": "training_file",
        "eval-prompt-data": "validation_file",
        "rollout-batch-size": f"method.{kind}.hyperparameters.batch_size",
        "global-batch-size": f"method.{kind}.hyperparameters.batch_size",
        "lr": f"method.{kind}.hyperparameters.learning_rate_multiplier",
        "num-epoch": f"method.{kind}.hyperparameters.n_epochs",
        "seed": "seed",
    }
    return err.renamed(lambda flag: own.get(flag, "method"))


# -- reading -----------------------------------------------------------------------------------------------------
def get_job(session: Session, principal: Principal, job_id: str) -> Job:
    principal.require(Action.JOB_READ)
    job = session.get(Job, job_id) if len(job_id) <= 40 else None
    if job is None or not principal.can_see_team(job.team_id) or SUBMITTED_KEY not in (job.submitted or {}):
        raise NotFound(f"fine-tuning job {job_id[:60]!r} not found", code="fine_tuning.not_found")
    return job


def list_jobs(
    session: Session,
    principal: Principal,
    *,
    after: str | None,
    limit: int,
    metadata: dict[str, str] | None = None,
) -> tuple[list[Job], bool]:
    """The team's fine-tuning jobs (an admin's: every team's), newest first; `after` the last id of the previous
    page; `metadata` only those whose metadata holds these pairs."""
    principal.require(Action.JOB_READ)
    q = (
        sa.select(Job)
        .where(Job.labels[LABEL].as_string().is_not(None))
        .order_by(Job.id.desc())
        .limit(limit + 1)
    )
    if not principal.is_admin:
        q = q.where(Job.team_id == principal.team_id)
    if after:
        q = q.where(Job.id < after)
    if metadata:  # filtered here: a page may then be shorter than limit, has_more says whether more follow
        q = q.limit(None)
    rows = [j for j in session.scalars(q) if SUBMITTED_KEY in (j.submitted or {})]
    if metadata:
        rows = [j for j in rows if _has_metadata(j, metadata)]
    return rows[:limit], len(rows) > limit


def _has_metadata(job: Job, wanted: dict[str, str]) -> bool:
    held = (job.submitted or {}).get(SUBMITTED_KEY, {}).get("metadata") or {}
    return all(held.get(k) == v for k, v in wanted.items())


class FineTuningJobStatus(StrEnum):
    """A fine-tuning job's status as OpenAI names it (`validating_files` never shows: the files are checked when
    the job is created)."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


_F = FineTuningJobStatus
#: Our job's status -> OpenAI's.
STATUS = {
    JobStatus.QUEUED: _F.QUEUED,
    JobStatus.ADMITTED: _F.RUNNING,
    JobStatus.STARTING: _F.RUNNING,
    JobStatus.RUNNING: _F.RUNNING,
    JobStatus.PREEMPTING: _F.RUNNING,
    JobStatus.CANCELLING: _F.CANCELLED,
    JobStatus.SUCCEEDED: _F.SUCCEEDED,
    JobStatus.FAILED: _F.FAILED,
    JobStatus.CANCELLED: _F.CANCELLED,
}


def _ts(value: Any) -> int:
    return int(value.timestamp())


def fine_tuned_model(session: Session, job: Job) -> str | None:
    """`ft:<base>:<team>:<suffix>:<job id>` once the job succeeded with an export; else None."""
    if job.status != JobStatus.SUCCEEDED or _export(session, job) is None:
        return None
    return model_name(job)


def model_name(job: Job) -> str:
    kept = (job.submitted or {}).get(SUBMITTED_KEY, {})
    parts = [
        kept.get("base") or "model",
        kept.get("team_name") or job.team_id,
        kept.get("suffix") or "",
        job.id,
    ]
    return FT_PREFIX + ":".join(re.sub(r"[^A-Za-z0-9._-]+", "-", str(p)) for p in parts)


def trained_tokens(session: Session, job: Job) -> int | None:
    """The tokens trained on (every step's batch, prompts included), from what each step reported: its
    `perf/tokens_per_s` times its `perf/step_time` (a step run again after a restart counts once). None when
    the job reported no step."""
    rows = session.execute(
        sa.select(Metric.step, Metric.name, Metric.value)
        .where(Metric.job_id == job.id, Metric.name.in_(("perf/tokens_per_s", "perf/step_time")))
        .order_by(Metric.id)
    )
    by_step: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        by_step.setdefault(step, {})[name] = value
    counts = [
        m["perf/tokens_per_s"] * m["perf/step_time"]
        for m in by_step.values()
        if "perf/tokens_per_s" in m and "perf/step_time" in m
    ]
    return round(sum(counts)) if counts else None


def public(session: Session, job: Job) -> dict[str, Any]:
    """The job as OpenAI's `fine_tuning.job` object."""
    kept = (job.submitted or {}).get(SUBMITTED_KEY, {})
    status = STATUS[job.status]
    terminal = job.status.is_terminal()
    error = None
    if job.status == JobStatus.FAILED:
        error = {
            "code": job.failure_reason or "failed",
            "message": (job.status_reason or "the job failed")[:2000],
            "param": None,
        }
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": _ts(job.created_at),
        "error": error,
        "fine_tuned_model": fine_tuned_model(session, job) if terminal else None,
        "finished_at": _ts(job.status_changed_at) if terminal else None,
        "hyperparameters": kept.get("hyperparameters") or {},
        "model": kept.get("model") or "",
        "organization_id": job.team_id,
        "result_files": [],
        "seed": int(kept.get("seed") or 0),
        "status": status,
        "trained_tokens": trained_tokens(session, job) if terminal else None,
        "training_file": kept.get("training_file") or "",
        "validation_file": kept.get("validation_file"),
        "estimated_finish": None,
        "integrations": None,
        "metadata": kept.get("metadata"),
        "method": kept.get("method"),
    }


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Items (newest first) after the one whose id is `after` (none such: from the start)."""
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return items[:limit], len(items) > limit


def events(session: Session, job: Job, *, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """OpenAI's `fine_tuning.job.event`s, newest first: the job's own events (state changes, driver events),
    one `metrics` event per step that reported `train/loss`, and one per checkpoint saved."""
    out: list[tuple[Any, str, dict[str, Any]]] = []
    for e in session.scalars(sa.select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)):
        if e.kind == "transition" and e.to_status is not None:
            message = f"{STATUS[e.to_status]} ({e.to_status}): {e.reason or ''}".rstrip(": ")
        else:
            message = f"{e.kind}: {e.reason or ''}".rstrip(": ")
        level = "error" if e.to_status == JobStatus.FAILED or e.kind.endswith("error") else "info"
        out.append(
            (e.time, f"ftevent-e{e.id}", {"level": level, "message": message[:4000], "type": "message"})
        )
    total = job.total_steps or None
    valid = _valid_losses(session, job)
    rewards = _by_step(session, job, "rollout/reward")  # reinforcement: the mean reward of the step's samples
    valid_rewards = _by_step(session, job, "eval/validation")  # and on the validation file
    loss_rows = session.execute(
        sa.select(Metric.step, Metric.value, Metric.time, Metric.id)
        .where(Metric.job_id == job.id, Metric.name == "train/loss")
        .order_by(Metric.id)
    ).all()
    for r in loss_rows:
        step = r.step + 1  # steps done (the runtime numbers its steps from 0)
        data: dict[str, Any] = {"step": step, "train_loss": r.value, "total_steps": total}
        text = f"Step {step}{f'/{total}' if total else ''}: training loss={r.value:.4f}"
        if step in valid:
            data["valid_loss"] = valid[step]
            text += f", validation loss={valid[step]:.4f}"
        if r.step in rewards:
            data["train_reward_mean"] = rewards[r.step]
            text += f", reward={rewards[r.step]:.4f}"
        if step in valid_rewards:
            data["valid_reward_mean"] = valid_rewards[step]
            text += f", validation reward={valid_rewards[step]:.4f}"
        out.append(
            (r.time, f"ftevent-m{r.id}", {"level": "info", "message": text, "type": "metrics", "data": data})
        )
    for c in session.scalars(
        sa.select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.id)
    ):
        out.append(
            (
                c.time,
                f"ftevent-c{c.id}",
                {
                    "level": "info",
                    "message": f"Checkpoint saved at step {c.step + 1} ({c.format})",
                    "type": "message",
                    "data": {"step": c.step + 1, "format": c.format},
                },
            )
        )
    out.sort(key=lambda x: (x[0], x[1]), reverse=True)
    items = [
        {"id": eid, "object": "fine_tuning.job.event", "created_at": _ts(t), "data": None, **body}
        for t, eid, body in out
    ]
    return _page(items, after, limit)


def _by_step(session: Session, job: Job, name: str) -> dict[int, float]:
    """One metric's values by step (a step reported again, after a restart: its last value)."""
    rows = session.execute(
        sa.select(Metric.step, Metric.value)
        .where(Metric.job_id == job.id, Metric.name == name)
        .order_by(Metric.id)
    )
    return {step: value for step, value in rows}


def _valid_losses(session: Session, job: Job) -> dict[int, float]:
    """The validation loss (`eval/loss`, on the validation file) by steps done: the runtime reports the
    evaluation after step r (from 0) as step r + 1."""
    return _by_step(session, job, "eval/loss")


def checkpoints(
    session: Session, job: Job, *, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """OpenAI's `fine_tuning.job.checkpoint`s, newest first: one per step saved (its export when there is one),
    with the step's metrics (train/loss; eval/loss as valid_loss). Steps are counted as OpenAI counts them,
    steps done: the runtime's step r (from 0) is step_number r + 1."""
    by_step: dict[int, Checkpoint] = {}
    for c in session.scalars(
        sa.select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.id)
    ):
        if c.step not in by_step or c.format == "hf":
            by_step[c.step] = c
    losses: dict[int, float] = {}
    if by_step:
        for step, value in session.execute(
            sa.select(Metric.step, Metric.value)
            .where(Metric.job_id == job.id, Metric.name == "train/loss", Metric.step.in_(list(by_step)))
            .order_by(Metric.id)
        ):
            losses[step] = value
    valid = _valid_losses(session, job)
    base = model_name(job)
    items = []
    for step in sorted(by_step, reverse=True):
        c = by_step[step]
        done = step + 1  # steps done (the runtime numbers its steps from 0)
        m: dict[str, Any] = {"step": float(done)}
        if step in losses:
            m["train_loss"] = losses[step]
        if done in valid:
            m["valid_loss"] = valid[done]
        items.append(
            {
                "id": f"ftckpt-{c.id}",
                "object": "fine_tuning.job.checkpoint",
                "created_at": _ts(c.time),
                "fine_tuned_model_checkpoint": f"{base}:ckpt-step-{done}",
                "fine_tuning_job_id": job.id,
                "metrics": m,
                "step_number": done,
            }
        )
    return _page(items, after, limit)
