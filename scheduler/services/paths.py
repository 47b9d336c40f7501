"""Resolves the paths inside a job spec, and keeps each team inside what it may reach.

Every path of a spec resolves, at submission, to one of:

- the submitting team's **area**, `<artifact_root>/teams/<team id>/`: `artifacts://X` is `X` there; its jobs'
  output folders are `jobs/<job id>/` there, so a relative output lands in the job's own folder;
- the output folder of one of the team's own jobs, `job://<name or id>/X`;
- a location an admin **granted** the team (`PathGrant`: read-only or read-write, in one pool or every pool),
  as an absolute path.

The platform's home (database, keys, logs) and the artifact store outside the team's area (other teams'
areas) are never reachable, even under a grant that covers them. Paths are resolved on the real filesystem:
`..`, symbolic links (one inside the area that leads out is refused), `~`, empty strings, NUL bytes, overlong
paths and other schemes (`s3://`, `hf://` …: the runtime opens local paths only) are refused with the field
named. `file://<id>` names a file the team uploaded (scheduler/services/files.py): an input only, resolved to
its local path (or its copy in the team's area, for a store elsewhere) and checked as any other path. A
Hugging Face hub id (`Org/Name`) is accepted in `hf-checkpoint` only and stays a hub id:
it is never read as a path. The resolved spec holds absolute, symlink-free paths; the driver checks them
again against the roots `driver_policy` lists (runtime/access.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from stat import S_ISLNK
from typing import Any, Literal

import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from jobspec.bounds import MAX_PATH_LENGTH
from jobspec.issues import SpecIssue
from jobspec.spec import FIELDS
from runtime.access import ROLLOUT_TEMPLATE, is_hub_id, within
from scheduler.db.models import Job, PathGrant
from scheduler.domain.jobs import JobStatus
from scheduler.services.files import resolve_file_ref

ARTIFACTS = "artifacts://"
JOB = "job://"
FILE = "file://"
TEAMS_DIR = "teams"  # <artifact_root>/teams/<team id>/: the teams' areas
JOBS_DIR = "jobs"  # <area>/jobs/<job id>/: the output folder of each job of the team
MAX_PATH_BYTES = MAX_PATH_LENGTH  # PATH_MAX: jobspec refuses longer path values in characters, this in bytes
MAX_NAME_BYTES = 255
MAX_EVAL_CONFIG_BYTES = 1 << 20
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")
# Outputs an export replaces as a whole: a folder already there is not this (new) job's, so it would fail.
REPLACED_OUTPUTS = frozenset({"save_hf"})
HUB_FIELDS = frozenset({"hf_checkpoint"})  # fields that take a Hugging Face hub id instead of a path

PathKind = Literal["input", "output"]


@dataclass
class Resolution:
    spec: dict[str, Any]
    inputs: list[dict[str, str]] = field(default_factory=list)  # jobs this one consumes
    issues: list[SpecIssue] = field(default_factory=list)  # errors
    warnings: list[SpecIssue] = field(default_factory=list)


@dataclass(frozen=True)
class Grant:
    path: Path  # absolute, normalized
    mode: str  # ro | rw


@dataclass(frozen=True)
class Producer:
    """A job of the team that `job://` names: its id and output folder."""

    id: str
    output_dir: Path


def team_area(artifact_root: Path, team_id: str) -> Path:
    """The team's area: what `artifacts://` names for it (created on first use)."""
    return Path(artifact_root) / TEAMS_DIR / team_id


def real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, root: Path) -> bool:
    """`runtime.access.within` (`path` is `root` or under it), by the paths' text when both are absolute: a
    `Path` compares its parts, which its text joins with '/' (the same answer without making a `Path` of each
    of `path`'s parents)."""
    p, r = str(path), str(root)
    if p[:1] != "/" or r[:1] != "/":
        return within(path, root)
    return p == r or p.startswith(r if r == "/" else r + "/")


def real_under(root: Path, rel: PurePosixPath | str) -> Path:
    """`real(root / rel)` for a `root` that is a real path already (absolute, symlink-free, as `real` gives it):
    only `rel`'s own components are looked at (one `lstat` each instead of one for every component of `root`
    too). A component that is a symbolic link, an absolute `rel` or one with '..' is resolved by `real` from the
    start, as before; a component that does not exist (or cannot be looked at) ends the walk, as nothing under
    it can be a link either."""
    parts = PurePosixPath(rel).parts
    if not parts:
        return root
    if parts[0] == "/" or ".." in parts:
        return real(root / rel)
    current = str(root)
    for i, name in enumerate(parts):
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except OSError:
            return Path(candidate, *parts[i + 1 :])
        if S_ISLNK(st.st_mode):
            return real(Path(candidate, *parts[i + 1 :]))
        current = candidate
    return Path(current)


@dataclass(frozen=True)
class TeamStorage:
    """What jobs of one team, in one pool, may reach."""

    home: Path  # the platform's home: never
    artifact_root: Path  # the artifact store: only through the team's area
    team_id: str
    team_name: str = ""
    pool: str | None = None
    grants: tuple[Grant, ...] = ()

    @cached_property
    def area(self) -> Path:
        return real_under(self._store, PurePosixPath(TEAMS_DIR, self.team_id))

    @cached_property
    def _store(self) -> Path:
        """The artifact store's real path (the area's is found from it)."""
        return real(self.artifact_root)

    @cached_property
    def protected(self) -> tuple[Path, ...]:
        return (real(self.home), self._store)

    def job_dir(self, job_id: str) -> Path:
        return self.area / JOBS_DIR / job_id

    def hint(self) -> str:
        team = self.team_name or self.team_id
        return (
            f"use artifacts://<path> (your team's area, {self.area}; `relaxctl models tiny` writes the "
            "examples' model and data there), job://<job>/<path> for your team's job outputs, a relative "
            f"output path (inside the job's own folder), or ask an admin for a grant "
            f"(`relaxctl admin grants add {team} <absolute path> --mode ro|rw`)"
        )

    def reach(self, path: Path, kind: PathKind, *, managed: tuple[Path, ...] = ()) -> str | None:
        """None when a job may read (input) or write (output) the real path `path`, else why not.

        The team's area and `managed` folders (the job's own, its producers') are the team's; anything else
        needs a grant (read-write for an output) and never reaches into the platform's home or the artifact
        store, whatever the grant covers."""
        if _within(path, self.area) or any(_within(path, m) for m in managed):
            return None
        home, store = self.protected
        if _within(path, store):
            return "is in the artifact store outside your team's area"
        if _within(path, home):
            return "is inside the platform's home"
        if _within(home, path) or _within(store, path):
            return "contains the platform's home or its artifact store"
        granted = [g for g in self.grants if _within(path, g.path)]
        if not granted:
            return "is outside your team's area and its grants"
        if kind == "output" and not any(g.mode == "rw" for g in granted):
            return "is under a read-only grant: jobs may read it, not write there"
        return None

    def driver_policy(self, job_id: str, producers: list[Path]) -> dict[str, Any]:
        """The roots a job's driver may open (runtime.access.PathPolicy)."""
        managed = [self.area, *producers]
        return {
            "job_id": job_id,
            "read": [str(p) for p in managed + [g.path for g in self.grants]],
            "write": [str(p) for p in managed + [g.path for g in self.grants if g.mode == "rw"]],
            "managed": [str(p) for p in managed],
            "deny": [str(p) for p in self.protected],
        }


# A team's grants (path, mode): all of them, or those of one pool and every pool. Built once.
_GRANTS = (
    sa.select(PathGrant.path, PathGrant.mode)
    .where(PathGrant.team_id == sa.bindparam("team_id"))
    .order_by(PathGrant.path)
)
_GRANTS_IN_POOL = _GRANTS.where(sa.or_(PathGrant.pool.is_(None), PathGrant.pool == sa.bindparam("pool")))


def team_storage(
    session: Session | None,
    *,
    home: Path,
    artifact_root: Path,
    team_id: str,
    team_name: str = "",
    pool: str | None,
    grant_rows: Iterable[tuple[str, str]] | None = None,
) -> TeamStorage:
    """A team's storage in `pool`, with the grants that apply there (its own and every-pool grants): read in
    `session`, or given as `grant_rows` (path, mode) when read already, ordered by path."""
    if grant_rows is None:
        assert session is not None
        q = _GRANTS_IN_POOL if pool else _GRANTS
        grant_rows = session.execute(q, {"team_id": team_id, "pool": pool} if pool else {"team_id": team_id})
    grants = tuple(Grant(Path(path), mode) for path, mode in grant_rows)
    return TeamStorage(
        home=Path(home),
        artifact_root=Path(artifact_root),
        team_id=team_id,
        team_name=team_name,
        pool=pool,
        grants=grants,
    )


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _safe_relative(rel: str) -> PurePosixPath | None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return p


def malformed(value: str) -> str | None:
    """Why `value` cannot be a path at all, or None."""
    if not value.strip():
        return "is empty"
    if "\x00" in value:
        return "contains a NUL byte"
    if len(value.encode()) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    if any(len(part.encode()) > MAX_NAME_BYTES for part in value.split("/")):
        return f"has a name longer than {MAX_NAME_BYTES} bytes"
    if value.startswith("~"):
        return "starts with '~', which nothing expands on the cluster"
    return None


def resolve_paths(
    session: Session,
    spec: dict[str, Any],
    *,
    storage: TeamStorage,
    job_dir: Path,
    path_fields: Mapping[str, PathKind] | None = None,
) -> Resolution:
    """`resolve_spec_paths` with `job://` looked up among the team's jobs in the database, and `file://` among
    its uploaded files."""
    return resolve_spec_paths(
        spec,
        storage=storage,
        job_dir=job_dir,
        find_producer=lambda ref: _find_producer(session, ref, storage.team_id),
        path_fields=path_fields,
        find_file=lambda ref: resolve_file_ref(
            session, team_id=storage.team_id, artifact_root=storage.artifact_root, ref=ref
        ),
    )


def resolve_spec_paths(
    spec: dict[str, Any],
    *,
    storage: TeamStorage,
    job_dir: Path,
    find_producer: Callable[[str], Producer | None],
    path_fields: Mapping[str, PathKind] | None = None,
    find_file: Callable[[str], Path | None] | None = None,
) -> Resolution:
    """Return a copy of `spec` whose path fields are absolute and symlink-free, with every problem collected.

    - `artifacts://X` is `X` in the team's area (it must exist when it is an input);
    - `job://<name or id>/X` is `X` inside the output folder of that job of the team (by name: its newest
      SUCCEEDED job with that name);
    - `file://<id>[/X]` is a file the team uploaded (`X` inside it, for a model unpacked into a folder): an
      input only, whose local path `find_file` gives (None: the team has no such file);
    - a relative output lands in the job's own folder; a relative input is refused (the cluster has no
      notion of the submitter's working directory), except a hub id in `hf-checkpoint`;
    - an absolute path must lie in the team's area or under a grant (read-write for an output);
    - nothing resolves into the platform's home or another team's area, whatever the spelling.
    """
    if path_fields is None:
        path_fields = {n: f.path_kind for n, f in FIELDS.items() if f.path_kind is not None}
    out = dict(spec)
    res = Resolution(spec=out)
    job_dir = Path(os.path.normpath(job_dir))  # not resolved: a job folder linked elsewhere is refused

    def real_job_path(rel: PurePosixPath) -> Path:
        """`real(job_dir / rel)`: from the team's area when the job's folder is in it (as `job_dir` gives it)."""
        if job_dir.parent.parent == storage.area:
            return real_under(storage.area, PurePosixPath(*job_dir.parts[-2:]) / rel)
        return real(job_dir / rel)

    def refuse(
        name: str, message: str, code: str = "spec.path_outside_team", hint: str | None = None
    ) -> None:
        res.issues.append(SpecIssue(code, _flag(name), message, storage.hint() if hint is None else hint))

    def check(
        name: str,
        kind: PathKind,
        value: str,
        path: Path,
        managed: tuple[Path, ...] = (),
        resolved: Path | None = None,
    ) -> Path | None:
        """The real path of `path` (`resolved`, when known) when the job may use it as `kind`, else None
        (refused)."""
        if resolved is None:
            resolved = real(path)
        why = storage.reach(resolved, kind, managed=managed)
        if why is not None:
            via = (
                f" (a symbolic link leads it to {resolved})"
                if resolved != Path(os.path.normpath(path))
                else ""
            )
            refuse(name, f"{value!r}{via} {why}")
            return None
        if (
            kind == "output"
            and name in REPLACED_OUTPUTS
            and ROLLOUT_TEMPLATE not in str(path)
            and (resolved.exists() or resolved.is_symlink())
        ):
            refuse(
                name,
                f"{value!r} already exists ({resolved}): the export would replace it, and a job only "
                "replaces folders it wrote itself",
                code="spec.output_exists",
                hint="export to a new folder (a relative path lands in the job's own folder), or remove the old one",
            )
            return None
        return resolved

    def must_exist(name: str, kind: PathKind, value: str, path: Path, where: str) -> None:
        if kind == "input" and ROLLOUT_TEMPLATE not in str(path) and not path.exists():
            refuse(
                name,
                f"{value} does not exist (looked at {path}){where}",
                code="spec.missing_input",
                hint="create it first, e.g. `relaxctl models tiny` builds artifacts://models/tiny and "
                "artifacts://datasets/arith in your team's area",
            )

    def resolve_file(name: str, kind: PathKind, value: str) -> str:
        """`file://<id>[/X]`: an uploaded file of the team, an input only; checked as any other path."""
        ref, _, sub = value[len(FILE) :].partition("/")
        rel = _safe_relative(sub) if sub else PurePosixPath(".")
        if kind == "output" or rel is None:
            refuse(
                name,
                f"{value!r}: "
                + ("an uploaded file is read-only" if kind == "output" else "leaves the file's folder"),
                code="spec.bad_path",
                hint="write outputs to a relative path (the job's own folder) or artifacts://<path>"
                if kind == "output"
                else "drop '..'",
            )
            return value
        found = find_file(ref) if find_file is not None and ref else None
        if found is None:
            refuse(
                name,
                f"{value}: no file with id {ref!r} in your team",
                code="spec.unknown_file_reference",
                hint="upload it first (`relaxctl files upload PATH`), and list your team's files with "
                "`relaxctl files list`",
            )
            return value
        resolved = check(name, kind, value, found / rel)
        if resolved is None:
            return value
        must_exist(name, kind, value, resolved, "")
        return str(resolved)

    def resolve_one(name: str, kind: PathKind, value: str) -> str:
        bad = malformed(value)
        if bad is not None:
            refuse(name, f"{value[:200]!r} {bad}", code="spec.bad_path", hint=storage.hint())
            return value
        if value.startswith(ARTIFACTS):
            rel = _safe_relative(value[len(ARTIFACTS) :])
            if rel is None:
                refuse(
                    name,
                    f"{value!r} leaves your team's area",
                    code="spec.bad_path",
                    hint="drop '..' and leading '/'",
                )
                return value
            if kind == "output" and rel == PurePosixPath("."):
                refuse(
                    name,
                    f"{value!r} names your whole area",
                    code="spec.bad_path",
                    hint="name a folder inside it",
                )
                return value
            path = storage.area / rel
            resolved = check(name, kind, value, path, resolved=real_under(storage.area, rel))
            if resolved is None:
                return value
            must_exist(name, kind, value, resolved, "")
            return str(resolved)
        if value.startswith(JOB):
            ref, _, sub = value[len(JOB) :].partition("/")
            rel = _safe_relative(sub) if sub else PurePosixPath(".")
            if rel is None:
                refuse(name, f"{value!r} leaves the job's folder", code="spec.bad_path", hint="drop '..'")
                return value
            producer = find_producer(ref) if ref else None
            if producer is None:
                refuse(
                    name,
                    f"{value}: no succeeded job named or with id {ref!r} in your team",
                    code="spec.unknown_job_reference",
                    hint="submit that job first and wait for it (`relaxctl submit FILE --wait`)",
                )
                return value
            root = real(producer.output_dir)
            path = root / rel
            # an input may be in an older layout's job folder; an output goes to the team's area only
            resolved = check(name, kind, value, path, managed=(root,) if kind == "input" else ())
            if resolved is None:
                return value
            must_exist(name, kind, value, resolved, f": job {producer.id} has no output {str(rel)!r}")
            if kind == "input":
                res.inputs.append({"field": _flag(name), "job_id": producer.id, "path": str(resolved)})
            return str(resolved)
        if value.startswith(FILE) and not value.startswith(FILE + "/"):  # file:///abs stays refused below
            return resolve_file(name, kind, value)
        scheme = _SCHEME.match(value)
        if scheme:
            refuse(
                name,
                f"{value!r}: the {scheme.group(1)}:// scheme is not supported (jobs open local paths)",
                code="spec.unsupported_scheme",
                hint=storage.hint(),
            )
            return value
        if os.path.isabs(value):
            resolved = check(name, kind, value, Path(value))
            return str(resolved) if resolved is not None else value
        if kind == "output":
            rel = _safe_relative(value)
            if rel is None or rel == PurePosixPath("."):
                refuse(name, f"{value!r} leaves the job's folder", code="spec.bad_path", hint="drop '..'")
                return value
            path = job_dir / rel
            resolved = check(name, kind, value, path, managed=(job_dir,), resolved=real_job_path(rel))
            return str(resolved) if resolved is not None else value
        if name in HUB_FIELDS and is_hub_id(value):
            # a hub model id: fetched from the hub by the runtime, never opened as a path
            if (storage.area / value).exists():
                res.warnings.append(
                    SpecIssue(
                        "spec.hub_id_like_area_path",
                        _flag(name),
                        f"{value!r} is taken as a Hugging Face hub id, not as the folder of that name in your "
                        "team's area",
                        f"write artifacts://{value} for the folder",
                        severity="warning",
                    )
                )
            return value
        refuse(
            name,
            f"relative input path {value!r}: the cluster cannot see your working directory",
            code="spec.relative_input",
            hint=storage.hint()
            + ("; a Hugging Face hub id (Org/Name) is taken by --hf-checkpoint only" if "/" in value else ""),
        )
        return value

    for name, kind in path_fields.items():
        value = out.get(name)
        if isinstance(value, str):
            out[name] = resolve_one(name, kind, value)
        elif isinstance(value, list):
            pairs = FIELDS[name].path_layout == "name_path_pairs" if name in FIELDS else False
            if pairs and len(value) % 2:
                refuse(
                    name,
                    "takes name/path pairs: an odd number of items",
                    code="spec.bad_path",
                    hint="name path [name path ...]",
                )
            out[name] = [
                resolve_one(name, kind, v) if isinstance(v, str) and (not pairs or i % 2 == 1) else v
                for i, v in enumerate(value)
            ]
    if isinstance(out.get("eval_config"), str) and not any(i.field == "eval-config" for i in res.issues):
        _check_eval_config(out["eval_config"], storage, res)
    return res


def _check_eval_config(path: str, storage: TeamStorage, res: Resolution) -> None:
    """The dataset paths an eval-config file names, as the runtime reads them (absolute, or relative to the
    file). The driver checks them again when it reads the file."""
    file = Path(path)
    try:
        if not file.is_file() or file.stat().st_size > MAX_EVAL_CONFIG_BYTES:
            return
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # the driver reports an unreadable file by itself
    section = doc.get("eval", doc) if isinstance(doc, dict) else {}
    raw = section.get("datasets") if isinstance(section, dict) else None
    if isinstance(raw, Mapping):
        entries = [{"name": k, **dict(v or {})} for k, v in raw.items() if isinstance(v, Mapping | None)]
    elif isinstance(raw, list):
        entries = [dict(v) for v in raw if isinstance(v, Mapping)]
    else:
        return
    for entry in entries:
        value = entry.get("path")
        if not isinstance(value, str):
            continue
        label = f"eval-config dataset {entry.get('name')!r}: {value!r}"
        bad = malformed(value) or ("uses a scheme (jobs open local paths)" if _SCHEME.match(value) else None)
        if bad is None:
            target = real(file.parent / value)
            bad = storage.reach(target, "input")
            if bad is not None and target != Path(os.path.normpath(file.parent / value)):
                bad = f"(a symbolic link leads it to {target}) {bad}"
        if bad is not None:
            res.issues.append(
                SpecIssue("spec.path_outside_team", "eval-config", f"{label} {bad}", storage.hint())
            )


def _find_producer(session: Session, ref: str, team_id: str) -> Producer | None:
    job = session.get(Job, ref)
    if job is None or job.team_id != team_id:
        job = session.scalar(
            sa.select(Job)
            .where(Job.team_id == team_id, Job.name == ref, Job.status == JobStatus.SUCCEEDED)
            .order_by(Job.finished_at.desc(), Job.id.desc())
            .limit(1)
        )
    return Producer(job.id, Path(job.output_dir)) if job is not None else None
