"""Elastic rollout on the platform (`--autoscaler-config`, docs/reference/elastic-rollout.md): the engine bounds
read at submission into the job's demand, and what a driver is told of the engines the scheduling pass
granted its job.

At submission `elastic_demand` reads the autoscaler YAML the spec names (its path resolved and checked with
the spec's other paths, `scheduler.services.paths`: in the team's area or under a grant; read here again
without following a link) and marks the rollout group elastic (`jobspec.demand.elastic_rollout`): the pass then
sees an elastic gang (`scheduler.scheduling`), takes engines back before it preempts a job and grows them
into idle GPUs (`Decision.resize`, written as the job's allocation rows). `granted_engines` is the rollout
role's rows as the answer to each driver report carries them (`ReportAck.rollout_engines`, numbered
`rollout_grant`): the driver stops and starts engines between steps to match them (`runtime.roles.elastic`) and
reports the grant it has followed (a report's `rollout_followed`), which frees the GPUs of the engines the pass
took back before (`release_followed`: until then they stay held). `record_wish` keeps what the driver
asks for (a report's `rollout_wish`: its autoscaler YAML's thresholds decide it) on the job, for the pass: it
grows the rollout no further, and gives back engines above it."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobspec.autoscaler import MAX_AUTOSCALER_CONFIG_BYTES, AutoscalerConfig, AutoscalerConfigError
from jobspec.demand import ResourceDemand, elastic_rollout
from jobspec.issues import SpecIssue
from runtime.report_protocol import RolloutWish
from scheduler.db.models import Allocation, Job, Node
from scheduler.domain.errors import InvalidSpec
from scheduler.services.paths import TeamStorage, real

ELASTIC_FIELD = "autoscaler-config"
ELASTIC_ROLE = "rollout"  # the role whose replicas are the engines an autoscaler scales
WISH_EVENT = "rollout_wish"  # a job event: the driver asks for a number of rollout engines, and why
# a job event: engines the pass took back are stopped (the driver followed a later grant), their GPUs free
STOPPED_EVENT = "rollout_engines_stopped"


def is_elastic(demand: dict[str, Any] | None) -> bool:
    """Whether a stored demand (`jobspec.demand.ResourceDemand` as JSON) has an elastic group."""
    return any(g.get("min_replicas") is not None for g in (demand or {}).get("groups", ()))


def elastic_demand(demand: dict[str, Any], spec: dict[str, Any], storage: TeamStorage) -> dict[str, Any]:
    """`demand` (the normalized spec's, as JSON) with its rollout group elastic when the spec (its paths resolved)
    sets `autoscaler_config`; unchanged otherwise. Raises `InvalidSpec` naming `autoscaler-config` when the
    file cannot be read, is not a valid autoscaler YAML, or its bounds do not fit the job's engines."""
    value = spec.get("autoscaler_config")
    if not value:
        return demand
    config = _read(Path(str(value)), storage)
    try:
        bounded = elastic_rollout(
            ResourceDemand.model_validate(demand), config.min_engines, config.max_engines
        )
    except ValueError as exc:
        raise _refused(str(exc).removeprefix(f"{ELASTIC_FIELD}: "), _HINT) from None
    return bounded.model_dump(mode="json")


_HINT = (
    "the YAML sets min_engines and max_engines (docs/reference/elastic-rollout.md); resource's rollout entry "
    "asks for a count of engines within them, on GPUs of their own"
)


def _read(path: Path, storage: TeamStorage) -> AutoscalerConfig:
    """The YAML at the resolved path, read without following a link (a path checked at resolution that became
    a link since is refused), at most `MAX_AUTOSCALER_CONFIG_BYTES`."""
    where = f"{path}"
    if not path.is_absolute() or real(path) != path:
        raise _refused(f"{where} is not a resolved path (a symbolic link?)", storage.hint(), "spec.bad_path")
    outside = storage.reach(path, "input")
    if outside is not None:
        raise _refused(f"{where} {outside}", storage.hint(), "spec.path_outside_team")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise _refused(f"{where} {why}", _HINT) from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_AUTOSCALER_CONFIG_BYTES + 1)
    if len(data) > MAX_AUTOSCALER_CONFIG_BYTES:
        raise _refused(f"{where} is over {MAX_AUTOSCALER_CONFIG_BYTES} bytes: not an autoscaler YAML", _HINT)
    try:
        return AutoscalerConfig.parse_text(data.decode("utf-8"), source=f"{ELASTIC_FIELD} {path.name}")
    except UnicodeDecodeError:
        raise _refused(f"{where} is not UTF-8 text", _HINT) from None
    except AutoscalerConfigError as exc:
        raise _refused(str(exc).removeprefix(f"{ELASTIC_FIELD} "), _HINT) from None


def _refused(message: str, hint: str, code: str = "spec.invalid_value") -> InvalidSpec:
    """The refusal, worded as the spec's other issues are (`submission._summary`)."""
    return InvalidSpec(
        f"invalid job spec: {ELASTIC_FIELD}: {message}",
        issues=[SpecIssue(code, ELASTIC_FIELD, message, hint)],
    )


def rollout_grant(session: Session, job: Job) -> tuple[list[dict[str, Any]], int] | None:
    """The rollout engines the job holds now, as the scheduling pass allocated them (one row per engine, in
    replica order: its node's name and Ray node id), and the grant's number (`Job.rollout_grant`: one more at
    each resize); None for a job whose rollout is not elastic (its answer carries nothing). Engines taken back
    and not yet stopped (`released_in`) are not the job's any more."""
    if not is_elastic(job.demand):
        return None
    rows = session.execute(
        sa.select(Allocation.node, Node.ray_node_id)
        .outerjoin(Node, sa.and_(Node.pool == Allocation.pool, Node.name == Allocation.node))
        .where(
            Allocation.job_id == job.id,
            Allocation.role == ELASTIC_ROLE,
            sa.not_(Allocation.shared),
            Allocation.released_in.is_(None),
        )
        .order_by(Allocation.replica, Allocation.id)
    ).all()
    engines = [{"node": node, "ray_node_id": ray_node_id} for node, ray_node_id in rows]
    return engines, job.rollout_grant or 0


def granted_engines(session: Session, job: Job) -> list[dict[str, Any]] | None:
    """`rollout_grant`'s engines."""
    grant = rollout_grant(session, job)
    return None if grant is None else grant[0]


def release_followed(session: Session, job: Job, followed: int) -> str | None:
    """The driver has followed grant `followed` (`rollout_grant`), so it has stopped every engine the pass took back
    before: those rows go and their GPUs are free for the next pass. The event's text, or None when none went."""
    stopped = (Allocation.job_id == job.id, Allocation.released_in <= followed)
    rows = session.execute(sa.select(Allocation.node, Allocation.gpus).where(*stopped)).all()
    if not rows:
        return None
    session.execute(sa.delete(Allocation).where(*stopped))
    per_node: dict[str, int] = {}
    for node, gpus in rows:
        per_node[node] = per_node.get(node, 0) + gpus
    where = ", ".join(f"{gpus} on {node}" for node, gpus in sorted(per_node.items()))
    return (
        f"the driver has stopped the {len(rows)} rollout engine{'' if len(rows) == 1 else 's'} the pass took "
        f"back: GPUs free ({where})"
    )


def wish_reason(wish: RolloutWish) -> str:
    """Why the driver asks for its engines, as the pass's resizes quote it: 'rollout 0.12 of the step < scale_in
    0.2'."""
    share, threshold = wish["share"], wish["threshold"]
    if threshold is None:
        return "brought within min_engines .. max_engines"
    if share < threshold:
        return f"rollout {share:.2f} of the step < scale_in {threshold:g}"
    return f"rollout {share:.2f} of the step > scale_out {threshold:g}"


def record_wish(job: Job, wish: RolloutWish) -> str | None:
    """Keep what an elastic job's driver asks for on the job (`Job.rollout_wish` and why; the caller's transaction
    writes it) for the scheduling pass, which reads it within the rollout's bounds; the event's text. None, and
    nothing kept, for a job whose rollout is not elastic."""
    if not is_elastic(job.demand):
        return None
    reason = wish_reason(wish)
    job.rollout_wish = wish["engines"]
    job.rollout_wish_reason = reason[:200]
    engines = wish["engines"]
    return f"the driver asks for {engines} rollout engine{'' if engines == 1 else 's'} after step {wish['step']}: {reason}"
