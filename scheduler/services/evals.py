"""CI evals (`/v1/evals`; docs/reference/evals.md): a model, eval sets with Relax's eval semantics and thresholds on
their metrics, run as an eval-only job submitted through the job submission service (queue, scheduler, runtime
as any job), at the built-in `eval` priority class (docs/adr/0011-eval-priority-class.md: before the team's
training jobs, and preempting them, within the team's quota) unless the request names a class it is granted. The
job's spec is Relax's run with no rollout left (`debug-rollout-only`, `start-rollout-id` = `num-rollout` = 1: it
evaluates once, `runtime.eval.eval_only`); its paths (the model included: `artifacts://`, `job://`, uploads,
grants) are resolved by the submission as any job's.

Everything is checked before anything is written: a threshold on a metric the eval will not produce is refused
naming the field, with the metrics it will produce. The verdict comes when the job ends
(scheduler/services/eval_verdicts.py).

Who may: creating is submitting a job (`Action.JOB_SUBMIT`); reading is reading jobs; another team's eval is
answered as missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from scheduler.db.models import Checkpoint, Eval, Job, Team
from scheduler.domain.errors import InvalidRequest, InvalidSpec, NotFound
from scheduler.domain.evals import EVAL_PRIORITY_CLASS, EvalOutcome, Verdict
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import JobStatus
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_for
from scheduler.services.eval_verdicts import EVAL_LABEL, Threshold, parse_threshold
from scheduler.services.paths import JOB, MAX_EVAL_CONFIG_BYTES, resolve_paths, team_storage
from scheduler.services.submission import Submission, judge_and_submit

#: Relax parameters an eval may set beside its own fields (normalized names). What makes it eval-only (the
#: model, the eval sets, the rollout counts, the mode) is the platform's.
SETTABLE = frozenset(
    {
        "train_backend", "seed", "rollout_seed", "resource", "colocate",
        "input_key", "label_key", "metadata_key", "tool_key", "conversation_key_map",
        "apply_chat_template", "apply_chat_template_kwargs", "system_prompt",
        "rollout_temperature", "rollout_top_p", "rollout_top_k", "rollout_max_response_len",
        "rollout_max_prompt_len", "rollout_max_context_len", "rollout_stop", "rollout_stop_token_ids",
        "rollout_skip_special_tokens", "eval_function_path", "rollout_function_path",
        "custom_generate_function_path", "eval_input_key", "eval_label_key", "eval_tool_key",
        "eval_temperature", "eval_top_p", "eval_top_k", "eval_max_response_len", "eval_max_prompt_len",
        "eval_min_new_tokens", "eval_max_context_len", "eval_reward_key",
        "rm_type", "rm_type_fallback", "rm_type_infer", "custom_rm_path", "reward_key",
        "reward_max_concurrency", "reward_num_workers", "rm_url", "notify_urls",
    }
)  # fmt: skip
MAX_DATASETS = 32  # eval sets of one eval (eval_prompt_data: 64 words, 32 pairs)
#: Set through the eval's own fields, not `spec`.
OWN_FIELDS = {
    "hf_checkpoint": "model",
    "eval_prompt_data": "eval_prompt_data",
    "eval_config": "eval_config",
    "n_samples_per_eval_prompt": "n_samples_per_eval_prompt",
    "log_passrate": "pass_at_k",
}


@dataclass
class EvalRequest:
    """A validated `POST /v1/evals` body (the API schema converts to this)."""

    model_job: str | None
    checkpoint_step: int | None
    model_path: str | None
    thresholds: list[Threshold | str | dict[str, Any]]
    eval_prompt_data: list[str] | None = None
    eval_config: str | None = None
    n_samples_per_eval_prompt: int = 1
    pass_at_k: bool | None = None
    spec: dict[str, Any] | None = None
    name: str | None = None
    team: str | None = None
    queue: str | None = None
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def _invalid(field: str, message: str, hint: str, code: str = "eval.invalid") -> InvalidRequest:
    return InvalidRequest.naming(field, message, hint, code=code)


# -- creating ------------------------------------------------------------------------------------------------------
def create_eval(
    session: Session,
    principal: Principal,
    req: EvalRequest,
    *,
    artifact_root: Path,
    home: Path,
    read_session: Session | None = None,
) -> tuple[Eval, Job]:
    """Check the request, submit its eval-only job and store the eval (a refusal writes nothing). Everything
    is checked and the job's spec judged in `read_session` when given (SQLite: a read-only unit of work, which
    holds no write lock meanwhile, as `POST /v1/jobs` does), then written in `session`."""
    principal.require(Action.JOB_SUBMIT)
    reads = read_session if read_session is not None else session
    team = team_for(reads, principal, req.team)
    thresholds = [_threshold(i, t) for i, t in enumerate(req.thresholds)]
    settings = _settings(req.spec)
    hf_checkpoint, model, model_key = _model(reads, team, req)
    log_passrate = req.pass_at_k if req.pass_at_k is not None else req.n_samples_per_eval_prompt > 1
    datasets, first_path = _datasets(reads, team, req, artifact_root=artifact_root, home=home)
    expected = expected_metrics(datasets, log_passrate=log_passrate)
    for i, t in enumerate(thresholds):
        if t.metric not in expected:
            raise _invalid(
                f"thresholds[{i}].metric",
                f"the eval will not produce the metric {t.metric!r}",
                f"a threshold takes one of the metrics it produces: {', '.join(expected)}"
                + ("" if log_passrate else " (pass@k needs pass_at_k and n_samples_per_eval_prompt > 1)"),
                code="eval.unknown_metric",
            )
    spec: dict[str, Any] = {
        "train_backend": "torch",
        "resource": {"rollout": [1, 1]},
        "rollout_batch_size": 1,
        **settings,
        "hf_checkpoint": hf_checkpoint,
        # Relax's run with no rollout left: it evaluates once (runtime.eval.eval_only); `prompt-data` is required
        # by the default data source and never read in this mode
        "debug_rollout_only": True,
        "num_rollout": 1,
        "start_rollout_id": 1,
        "prompt_data": first_path,
        "eval_interval": 1,
        "n_samples_per_eval_prompt": req.n_samples_per_eval_prompt,
        "log_passrate": log_passrate,
        "save": "eval",  # the per-sample records: <job>/eval/rollout_result/eval/1.jsonl
    }
    if req.eval_config:
        spec["eval_config"] = req.eval_config
    else:
        spec["eval_prompt_data"] = list(req.eval_prompt_data or [])
    eval_id = new_id("ev")
    name = req.name or _default_name(model)
    sub = Submission(
        name=name,
        team=req.team,
        queue=req.queue,
        # the eval class (no grant needed; docs/adr/0011-eval-priority-class.md), or a class the team is granted
        priority_class=req.priority_class or EVAL_PRIORITY_CLASS,
        labels={**req.labels, EVAL_LABEL: eval_id},
        spec=spec,
        eval_job=True,
    )
    try:
        job = judge_and_submit(session, reads, principal, sub, artifact_root=artifact_root, home=home)
    except InvalidSpec as err:
        raise _renamed(
            err,
            model_field="model.job" if req.model_job else "model.path",
            data_field="eval_config" if req.eval_config else "eval_prompt_data",
        ) from err
    model["hf_checkpoint"] = job.spec.get("hf_checkpoint")
    ev = Eval(
        id=eval_id,
        team_id=job.team_id,
        name=name,
        job_id=job.id,
        model=model,
        model_key=model_key,
        datasets=datasets,
        thresholds=[
            {
                "metric": t.metric,
                "op": t.op,
                "value": t.value,
                "actual": None,
                "verdict": str(Verdict.PENDING),
            }
            for t in thresholds
        ],
        expected_metrics=expected,
        metric_values=None,
        outcome=EvalOutcome.RUNNING,
        created_by=principal.key_id,
    )
    session.add(ev)
    session.flush()
    return ev, job


def _threshold(i: int, raw: Threshold | str | dict[str, Any]) -> Threshold:
    if isinstance(raw, Threshold):
        return raw
    if isinstance(raw, dict):
        return Threshold(str(raw["metric"]), str(raw["op"]), float(raw["value"]))
    parsed = parse_threshold(raw)
    if parsed is None:
        raise _invalid(
            f"thresholds[{i}]",
            f"{raw[:100]!r} is not a threshold",
            "write `<metric> <op> <number>` with op one of >=, >, <=, <, ==, e.g. `eval/gsm8k >= 0.6`",
            code="eval.bad_threshold",
        )
    return parsed


def _settings(spec: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (spec or {}).items():
        name = str(key).lstrip("-").replace("-", "_")
        if name in OWN_FIELDS:
            raise _invalid(
                f"spec.{key}",
                f"{key} is set by the eval's own field {OWN_FIELDS[name]!r}",
                f"give it as {OWN_FIELDS[name]} instead",
            )
        if name not in SETTABLE:
            raise _invalid(
                f"spec.{key}",
                f"an eval does not take the parameter {key!r}",
                "an eval's spec takes its sampling, reward, data keys, chat template, seed and resource: "
                + ", ".join(sorted(n.replace("_", "-") for n in SETTABLE)),
            )
        out[name] = value
    return out


def _model(session: Session, team: Team, req: EvalRequest) -> tuple[str, dict[str, Any], str]:
    """(the spec's hf-checkpoint, the eval's model as asked, its key in the model's history)."""
    model: dict[str, Any] = {"job": None, "checkpoint_step": req.checkpoint_step, "step": None, "path": None}
    if (req.model_job is None) == (req.model_path is None):
        raise _invalid(
            "model",
            "give the model as one of model.job and model.path",
            "model.job: one of your jobs (its export, or checkpoint_step's checkpoint); model.path: a model "
            "folder your team may read, e.g. artifacts://models/tiny",
        )
    if req.model_path is not None:
        if req.checkpoint_step is not None:
            raise _invalid(
                "model.checkpoint_step",
                "checkpoint_step goes with model.job",
                "leave it out, or give model.job",
            )
        model["path"] = req.model_path
        return req.model_path, model, req.model_path[:300]
    assert req.model_job is not None
    job = _team_job(session, team, req.model_job)
    model["job"] = job.id
    step = req.checkpoint_step
    rows = list(
        session.execute(
            sa.select(Checkpoint.step, Checkpoint.path, Checkpoint.format)
            .where(Checkpoint.job_id == job.id)
            .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
        )
    )
    if step is not None:
        at = [r for r in rows if r.step == step]
        chosen = next((r for r in at if r.format == "hf"), None) or next(iter(at), None)
        if chosen is None:
            steps = sorted({r.step for r in rows})
            raise _invalid(
                "model.checkpoint_step",
                f"job {job.name!r} ({job.id}) has no checkpoint of step {step}",
                f"its checkpoints are of steps {steps}" if steps else "it has no checkpoint yet",
                code="eval.no_checkpoint",
            )
    else:
        chosen = next((r for r in rows if r.format == "hf"), None) or next(iter(rows), None)
        if chosen is None:
            raise _invalid(
                "model.job",
                f"job {job.name!r} ({job.id}) has no export nor checkpoint yet",
                "evaluate a job that saved (save-hf or save), or give model.path",
                code="eval.no_checkpoint",
            )
    folder = Path(chosen.path) if chosen.format == "hf" else Path(chosen.path) / "model"
    try:
        ref = f"{JOB}{job.id}/{folder.relative_to(job.output_dir).as_posix()}"
    except ValueError:
        ref = str(folder)  # saved outside its folder (a granted path): resolved as a path of the team
    model["step"] = chosen.step  # the step of what was evaluated (asked for, or the newest)
    return ref, model, f"job:{job.id}"  # one history per job: its exports and checkpoints over its steps


def _team_job(session: Session, team: Team, ref: str) -> Job:
    job = session.get(Job, ref)
    if job is None or job.team_id != team.id:
        job = session.scalar(
            sa.select(Job)
            .where(Job.team_id == team.id, Job.name == ref, Job.status == JobStatus.SUCCEEDED)
            .order_by(Job.created_at.desc())
            .limit(1)
        )
    if job is None:
        raise _invalid(
            "model.job",
            f"no job {ref!r} of team {team.name!r} (by name: none SUCCEEDED)",
            "name one of your team's jobs by id, or by the name of one that succeeded (`relaxctl jobs list`)",
            code="eval.model_not_found",
        )
    return job


def _datasets(
    session: Session, team: Team, req: EvalRequest, *, artifact_root: Path, home: Path
) -> tuple[list[dict[str, Any]], str]:
    """([{name, path, n_samples}], a path for `prompt-data`) from eval_prompt_data or the eval-config file."""
    if req.eval_config:
        return _config_datasets(session, team, req, artifact_root=artifact_root, home=home)
    pairs = list(req.eval_prompt_data or [])
    if not pairs:
        raise _invalid(
            "eval_prompt_data",
            "an eval needs eval sets",
            "give eval_prompt_data as name/path pairs ([gsm8k, artifacts://data/gsm8k.jsonl]) or eval_config",
        )
    if len(pairs) % 2:
        raise _invalid(
            "eval_prompt_data", "takes name/path pairs: an odd number of items", "name path [name path ...]"
        )
    names = pairs[0::2]
    for i, name in enumerate(names):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
            raise _invalid(
                f"eval_prompt_data[{2 * i}]",
                f"{name[:100]!r} is not a dataset name",
                "a name of letters, digits, '.', '_' or '-' (it names the metric eval/<name>)",
            )
    if len(set(names)) != len(names):
        raise _invalid("eval_prompt_data", "a dataset name is given twice", "give each eval set its own name")
    n = req.n_samples_per_eval_prompt
    return [
        {"name": name, "path": path, "n_samples": n} for name, path in zip(names, pairs[1::2], strict=True)
    ], pairs[1]


def _config_datasets(
    session: Session, team: Team, req: EvalRequest, *, artifact_root: Path, home: Path
) -> tuple[list[dict[str, Any]], str]:
    """The eval sets an eval-config file names (its names and samples per prompt), read where the team may."""
    assert req.eval_config is not None
    storage = team_storage(
        session, home=home, artifact_root=artifact_root, team_id=team.id, team_name=team.name, pool=None
    )
    res = resolve_paths(
        session,
        {"eval_config": req.eval_config},
        storage=storage,
        job_dir=storage.job_dir("eval-check"),
        path_fields={"eval_config": "input"},
    )
    if res.issues:
        issue = res.issues[0]
        raise _invalid("eval_config", issue.message, issue.hint, code=issue.code)
    path = Path(res.spec["eval_config"])
    hint = "eval_config: {eval: {defaults: {...}, datasets: [{name, path, ...}]}} (Relax's --eval-config)"
    try:
        if path.stat().st_size > MAX_EVAL_CONFIG_BYTES:
            raise _invalid("eval_config", f"{req.eval_config} is over {MAX_EVAL_CONFIG_BYTES} bytes", hint)
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise _invalid(
            "eval_config", f"{req.eval_config} cannot be read: {type(err).__name__}", hint
        ) from err
    section = doc.get("eval", doc) if isinstance(doc, dict) else None
    section = section if isinstance(section, dict) else {}
    defaults = section.get("defaults") if isinstance(section.get("defaults"), dict) else {}
    raw = section.get("datasets")
    if isinstance(raw, dict):
        entries = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in raw.items()]
    elif isinstance(raw, list):
        entries = [v for v in raw if isinstance(v, dict)]
    else:
        entries = []
    if len(entries) > MAX_DATASETS:
        raise _invalid(
            "eval_config", f"{req.eval_config} names {len(entries)} eval sets", f"at most {MAX_DATASETS}"
        )
    if not entries or any(
        not isinstance(e.get("name"), str) or not isinstance(e.get("path"), str) for e in entries
    ):
        raise _invalid(
            "eval_config", f"{req.eval_config}: needs eval.datasets, each with a name and a path", hint
        )
    datasets = []
    for e in entries:
        n = e.get("n_samples_per_eval_prompt", defaults.get("n_samples_per_eval_prompt"))
        n = (
            int(n)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1
            else req.n_samples_per_eval_prompt
        )
        datasets.append({"name": e["name"], "path": e["path"], "n_samples": n, "config": req.eval_config})
    return datasets, req.eval_config


def expected_metrics(datasets: list[dict[str, Any]], *, log_passrate: bool) -> list[str]:
    """The `eval/*` metrics the eval-only job reports for these eval sets, as `runtime.eval.eval_metrics` names
    them: eval/<name> (mean reward), eval/<name>-truncated_ratio, eval/<name>/response_len and, with pass@k,
    eval/<name>-pass@k for k = 1, 2, 4, ... up to the samples per prompt (more than one)."""
    out: list[str] = []
    for d in datasets:
        name = d["name"]
        out += [f"eval/{name}", f"eval/{name}-truncated_ratio", f"eval/{name}/response_len"]
        n = int(d["n_samples"])
        if log_passrate and n > 1:
            k = 1
            while k <= n:
                out.append(f"eval/{name}-pass@{k}")
                k *= 2
    return out


def _default_name(model: dict[str, Any]) -> str:
    base = model.get("job") or Path(str(model.get("path") or "model")).name or "model"
    return ("eval-" + re.sub(r"[^A-Za-z0-9._-]+", "-", str(base)).strip("-"))[:100]


def _renamed(err: InvalidSpec, *, model_field: str, data_field: str) -> InvalidSpec:
    """The submission's refusal, with the spec's fields named as the eval's request names them."""
    own = {"hf-checkpoint": model_field, "prompt-data": data_field, "eval-prompt-data": data_field}
    own["eval-config"] = "eval_config"

    def name(flag: str) -> str:
        if flag in own:
            return own[flag]
        return f"spec.{flag}" if flag.replace("-", "_") in SETTABLE else flag or "spec"

    return err.renamed(name)


# -- reading -------------------------------------------------------------------------------------------------------
def get_eval(session: Session, principal: Principal, eval_id: str) -> tuple[Eval, JobStatus | None]:
    principal.require(Action.JOB_READ)
    ev = session.get(Eval, eval_id)
    if ev is None or not principal.can_see_team(ev.team_id):
        raise NotFound(f"eval {eval_id} not found", code="eval.not_found")
    return ev, session.scalar(sa.select(Job.status).where(Job.id == ev.job_id))


def list_evals(
    session: Session,
    principal: Principal,
    *,
    team: str | None = None,
    model: str | None = None,
    outcome: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> tuple[list[tuple[Eval, JobStatus | None]], str | None]:
    """The team's evals (an admin's: every team's, or `team`'s), newest first; `model`: one model's history
    (its `model_key`); `after`: the last id of the previous page."""
    principal.require(Action.JOB_READ)
    if outcome is not None and outcome not in set(EvalOutcome):
        raise _invalid("outcome", f"unknown eval outcome {outcome!r}", f"one of {', '.join(EvalOutcome)}")
    q = (
        sa.select(Eval, Job.status)
        .join(Job, Job.id == Eval.job_id, isouter=True)
        .order_by(Eval.id.desc())
        .limit(limit + 1)
    )
    if team is not None or not principal.is_admin:
        q = q.where(Eval.team_id == team_for(session, principal, team).id)
    if model is not None:
        q = q.where(Eval.model_key == model)
    if outcome is not None:
        q = q.where(Eval.outcome == outcome)
    if after is not None:
        q = q.where(Eval.id < after)
    rows = [(r[0], r[1]) for r in session.execute(q)]
    return rows[:limit], rows[limit - 1][0].id if len(rows) > limit else None
