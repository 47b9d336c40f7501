"""Resolves the paths inside a job spec: artifacts:// and job:// references, relative outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Job
from scheduler.domain.jobs import JobStatus

ARTIFACTS = "artifacts://"
JOB = "job://"


@dataclass
class PathIssue:
    field: str
    message: str
    hint: str
    code: str = "spec.bad_path"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message, "hint": self.hint}


@dataclass
class Resolution:
    spec: dict[str, Any]
    inputs: list[dict[str, str]] = field(default_factory=list)  # jobs this one consumes
    issues: list[PathIssue] = field(default_factory=list)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _safe_relative(rel: str) -> PurePosixPath | None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return p


def resolve_paths(
    session: Session,
    spec: dict[str, Any],
    *,
    path_fields: dict[str, Literal["input", "output"]],
    artifact_root: Path,
    job_dir: Path,
    team_id: str,
) -> Resolution:
    """Return a copy of `spec` whose path fields are absolute, with every problem collected.

    - `artifacts://X` is `<artifact_root>/X` (it must exist when it is an input);
    - `job://<name or id>/X` is `X` inside the output directory of that job (by name: the newest
      SUCCEEDED job of the caller's team with that name);
    - a relative output path lands in the job's own directory; a relative input path is refused,
      since the cluster has no notion of the submitter's working directory.
    """
    out = dict(spec)
    res = Resolution(spec=out)

    def resolve_one(name: str, kind: str, value: str) -> str:
        if value.startswith(ARTIFACTS):
            rel = _safe_relative(value[len(ARTIFACTS) :])
            if rel is None:
                res.issues.append(
                    PathIssue(
                        _flag(name), f"{value!r} leaves the artifact store", "drop '..' and leading '/'"
                    )
                )
                return value
            path = artifact_root / rel
            if kind == "input" and not path.exists():
                res.issues.append(
                    PathIssue(
                        _flag(name),
                        f"{value} does not exist (looked at {path})",
                        "create it first, e.g. `relaxctl models tiny` builds artifacts://models/tiny "
                        "and artifacts://datasets/arith",
                        code="spec.missing_input",
                    )
                )
            return str(path)
        if value.startswith(JOB):
            ref, _, sub = value[len(JOB) :].partition("/")
            rel = _safe_relative(sub) if sub else PurePosixPath(".")
            producer = _find_producer(session, ref, team_id)
            if rel is None:
                res.issues.append(
                    PathIssue(_flag(name), f"{value!r} leaves the job's directory", "drop '..'")
                )
                return value
            if producer is None:
                res.issues.append(
                    PathIssue(
                        _flag(name),
                        f"{value}: no succeeded job named or with id {ref!r} in your team",
                        "submit that job first and wait for it (`relaxctl submit FILE --wait`)",
                        code="spec.unknown_job_reference",
                    )
                )
                return value
            path = Path(producer.output_dir) / rel
            if kind == "input" and not path.exists():
                res.issues.append(
                    PathIssue(
                        _flag(name),
                        f"{value}: job {producer.id} has no output {str(rel)!r} (looked at {path})",
                        "check the producing job's save/save-hf settings",
                        code="spec.missing_input",
                    )
                )
            res.inputs.append({"field": _flag(name), "job_id": producer.id, "path": str(path)})
            return str(path)
        if kind == "output" and not Path(value).is_absolute():
            rel = _safe_relative(value)
            if rel is None:
                res.issues.append(
                    PathIssue(_flag(name), f"{value!r} leaves the job's directory", "drop '..'")
                )
                return value
            return str(job_dir / rel)
        if kind == "input" and not Path(value).is_absolute() and "://" not in value:
            res.issues.append(
                PathIssue(
                    _flag(name),
                    f"relative input path {value!r}: the cluster cannot see your working directory",
                    "use an absolute path on shared storage, artifacts://<path> or job://<job>/<path>",
                    code="spec.relative_input",
                )
            )
        return value

    for name, kind in path_fields.items():
        value = out.get(name)
        if isinstance(value, str):
            out[name] = resolve_one(name, kind, value)
        elif isinstance(value, list):
            out[name] = [
                resolve_one(name, kind, v) if isinstance(v, str) and ("://" in v or "/" in v) else v
                for v in value
            ]
    return res


def _find_producer(session: Session, ref: str, team_id: str) -> Job | None:
    job = session.get(Job, ref)
    if job is not None and job.team_id == team_id:
        return job
    return session.scalar(
        sa.select(Job)
        .where(Job.team_id == team_id, Job.name == ref, Job.status == JobStatus.SUCCEEDED)
        .order_by(Job.finished_at.desc(), Job.id.desc())
        .limit(1)
    )
