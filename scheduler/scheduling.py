"""The scheduling pass: lock, read the pools and jobs into a policy snapshot, decide, write it all at once."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler import policy as P
from scheduler.celery_app import make_celery
from scheduler.db.engine import Database
from scheduler.db.models import (
    Allocation,
    Checkpoint,
    Job,
    JobEvent,
    JobWait,
    Node,
    Pool,
    PriorityClass,
    Queue,
    SchedulerLock,
    Team,
    utcnow,
)
from scheduler.dispatch import Dispatcher
from scheduler.domain.evals import EVAL_PRIORITY_CLASS
from scheduler.domain.jobs import HOLDING_SLOTS, STOPPING, JobStatus
from scheduler.observability import observe_pass
from scheduler.policy.invariants import check
from scheduler.policy.placement import gangs_of
from scheduler.policy.types import Resize, demand_gpus
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.platform import eval_rank_beyond_quota
from scheduler.transactions import after_commit

log = logging.getLogger(__name__)

RESIZE_EVENT = "rollout_resized"  # a job event: the pass took back or granted elastic rollout engines
_RESIZABLE = HOLDING_SLOTS - STOPPING  # holds its slots, not while it stops (the policy's JobView.running)


@dataclass
class PassResult:
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    # elastic jobs whose rollout engines the pass took back or granted (`Decision.resize`)
    resized: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def pass_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _take_pass_lock(session: Session, holder: str) -> None:
    # Updating the lock row first makes this transaction the only pass until it commits: PostgreSQL
    # holds the row lock, SQLite the database write lock (transactions begin IMMEDIATE there).
    session.execute(
        sa.update(SchedulerLock)
        .where(SchedulerLock.name == "pass")
        .values(holder=holder, acquired_at=utcnow())
    )


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def node_key(pool: str, node: str) -> str:
    """Node names are unique within a pool; the policy sees them qualified by pool."""
    return f"{pool}/{node}"


@functools.lru_cache(maxsize=4096)
def _gangs_of_text(demand: str) -> tuple[P.Gang, ...]:
    """`gangs_of` a demand as the database's JSON text, its elastic group (`--autoscaler-config`: the rollout
    engines' `min_replicas` .. `max_replicas`, read at submission) an elastic gang at the count its spec asks
    for. A pass reads every active job's demand: parsed once per distinct text (jobs submitted alike share
    one), not once per job and pass."""
    parsed = json.loads(demand)
    gangs = gangs_of(parsed)
    bounds = {
        g["role"]: (g["min_replicas"], g.get("max_replicas") or g["min_replicas"])
        for g in parsed.get("groups", ())
        if g.get("min_replicas") is not None and not g.get("shares_with")
    }
    if not bounds:
        return gangs
    return tuple(
        _elastic(g, *bounds[g.role], count=g.count) if g.role in bounds and g.count > 0 else g for g in gangs
    )


def _elastic(gang: P.Gang, low: int, high: int, *, count: int) -> P.Gang:
    """`gang` elastic between `low` and `high` replicas, holding `count` now, its spec's `gang.base` asked
    (the range widened to hold both: a Gang refuses a count outside its range)."""
    base = gang.base
    return dataclasses.replace(
        gang,
        count=count,
        min_count=max(1, min(low, count, base)),
        max_count=max(high, count, base),
        base_count=base,
    )


def _held(
    demand: tuple[P.Gang, ...],
    placed: list[P.Assignment],
    wish: int | None = None,
    why: str | None = None,
) -> tuple[P.Gang, ...]:
    """A running job's demand with its elastic gang at the replicas its allocation holds now (the pass resizes
    it by rewriting the role's allocation rows, `_apply_resize`) and what its driver asks for (`Job.rollout_wish`,
    `scheduler.services.elastic.record_wish`); a rigid demand as it is."""
    out = demand
    for gang in demand:
        if not gang.elastic:
            continue
        held = len({a.replica for a in placed if a.role == gang.role and not a.shared})
        now = gang
        if held and held != gang.count:
            now = _elastic(gang, gang.floor, gang.ceiling, count=held)
        if wish is not None and wish > 0:
            now = dataclasses.replace(now, wish=wish, wish_reason=why or "")
        if now is not gang:
            out = tuple(now if g is gang else g for g in out)
    return out


def _json_text(value: str | None) -> Any:
    return None if value is None or value == "null" else json.loads(value)


@dataclass(frozen=True)
class _Row:
    """What a pass reads of an active job: the policy's view of it, and what the pass may write back."""

    status: JobStatus
    pool: str
    wait_reason: str | None
    queue_position: int | None
    nominated_nodes: list[str] | None
    elastic: bool = False  # its demand has an elastic gang (`--autoscaler-config`)


# The columns of an active job a pass reads: never its spec or submitted request (tens of kB of JSON each).
_JOB_COLUMNS = (
    Job.id,
    Job.queue,
    Job.pool,
    Job.status,
    Job.created_at,
    sa.cast(Job.demand, sa.Text).label("demand"),  # as text: see _gangs_of_text
    Job.priority,
    Job.preemptible,
    Job.priority_class,
    Job.team_id,
    Job.launched_at,
    Job.admitted_at,
    Job.queued_at,
    Job.preemptions,
    Job.service_gpu_s,
    Job.rollout_wish,  # an elastic job's driver's wish (mostly null)
    Job.rollout_wish_reason,
    # the queued jobs' `JobWait`s (an outer join: `_ACTIVE`)
    sa.cast(JobWait.nominated_nodes, sa.Text).label("nominated_nodes"),  # mostly null: parsed when not
    JobWait.wait_reason,
    JobWait.queue_position,
)


def load_snapshot(session: Session, now: datetime) -> P.Snapshot:
    """Everything the policy needs, read in a handful of queries."""
    return _load(session, now)[0]


def _load(session: Session, now: datetime) -> tuple[P.Snapshot, dict[str, _Row]]:
    cordoned_pools = set(session.scalars(sa.select(Pool.name).where(Pool.cordoned)))
    nodes = tuple(
        P.Node(
            name=node_key(n.pool, n.name),
            pool=n.pool,
            gpus=n.gpus,
            labels=frozenset(f"{k}={v}" for k, v in (n.labels or {}).items()),
            schedulable=n.alive and not n.cordoned and n.pool not in cordoned_pools,
            alive=n.alive,
        )
        for n in session.scalars(sa.select(Node).order_by(Node.pool, Node.name))
    )
    team_rows = list(session.scalars(sa.select(Team)))
    teams = {t.id: t.name for t in team_rows}
    queues = tuple(
        P.Queue(
            name=q.name,
            pool=q.pool,
            team=teams.get(q.team_id, q.team_id),
            nominal_gpus=q.nominal_gpus,
            borrowing_limit=q.borrowing_limit,
            lending_limit=q.lending_limit,
            weight=q.weight,
        )
        for q in session.scalars(sa.select(Queue))
    )
    class_rows = list(session.scalars(sa.select(PriorityClass)))
    classes = tuple(
        P.PriorityClass(name=c.name, value=c.value, preemptible=c.preemptible) for c in class_rows
    )
    # an eval job's rank beyond its queue's quota: its team's highest training class (docs/adr/0011)
    eval_rank = {t.id: eval_rank_beyond_quota(class_rows, t) for t in team_rows}
    active_statuses = [s for s in JobStatus if not s.is_terminal()]  # waiting or holding slots
    active = session.execute(
        sa.select(*_JOB_COLUMNS)
        .select_from(sa.outerjoin(Job, JobWait, JobWait.job_id == Job.id))
        .where(Job.status.in_(active_statuses))
    ).all()
    ids = {j.id for j in active}
    placements: dict[str, list[P.Assignment]] = {}
    # engines taken back, held until their driver has stopped them (`allocations.released_in`)
    releasing: dict[str, list[tuple[str, int]]] = {}
    # allocations exist only for jobs holding slots, all of them active
    for a in session.scalars(sa.select(Allocation)):
        if a.job_id not in ids:
            continue
        if a.released_in is not None:
            releasing.setdefault(a.job_id, []).append((node_key(a.pool, a.node), a.gpus))
        else:
            placements.setdefault(a.job_id, []).append(
                P.Assignment(
                    role=a.role,
                    replica=a.replica,
                    node=node_key(a.pool, a.node),
                    gpus=a.gpus,
                    shared=a.shared,
                )
            )
    last_ckpt = dict(
        session.execute(
            sa.select(Checkpoint.job_id, sa.func.max(Checkpoint.time))
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.status.in_(active_statuses))
            .group_by(Checkpoint.job_id)
        ).all()
    )
    jobs = []
    rows: dict[str, _Row] = {}
    for j in active:
        status = j.status
        placed = placements.get(j.id)
        nominated = _json_text(j.nominated_nodes)
        demand = _gangs_of_text(j.demand)
        elastic = any(g.elastic for g in demand)
        if placed and elastic:
            demand = _held(demand, placed, j.rollout_wish, j.rollout_wish_reason)
        rows[j.id] = _Row(status, j.pool, j.wait_reason, j.queue_position, nominated, elastic)
        jobs.append(
            P.JobView(
                id=j.id,
                queue=j.queue,
                submit_time=j.created_at.timestamp(),
                demand=demand,
                priority=j.priority,
                borrow_priority=eval_rank.get(j.team_id) if j.priority_class == EVAL_PRIORITY_CLASS else None,
                preemptible=j.preemptible,
                state=status,
                placement=P.Placement(tuple(placed)) if placed else None,
                started_at=_ts(j.launched_at or j.admitted_at) if status.holds_slots() else None,
                last_checkpoint_at=_ts(last_ckpt.get(j.id)),
                queued_at=_ts(j.queued_at),
                preemptions=j.preemptions,
                service_gpu_s=j.service_gpu_s,
                nominated_nodes=frozenset(nominated or ()) if status == JobStatus.QUEUED else frozenset(),
                releasing=tuple(releasing.get(j.id, ())),
            )
        )
    snapshot = P.Snapshot(
        now=now.timestamp(), nodes=nodes, queues=queues, jobs=tuple(jobs), priority_classes=classes
    )
    return snapshot, rows


def run_scheduling_pass(
    db: Database,
    dispatcher: Dispatcher,
    *,
    holder: str | None = None,
    config: P.PolicyConfig | None = None,
) -> PassResult:
    """One pass, one transaction: admissions, preemptions and wait reasons are written together, and
    launch tasks are enqueued only after the commit. A decision that breaks an invariant (a GPU
    allocated twice, a placement on a cordoned or dead node, a gang not placed whole) is not applied.

    It reads the active jobs' scheduling columns only, and writes only what changed: the admitted and
    preempted jobs (through `JobLifecycle`), and the queued jobs whose wait reason, position or nominated nodes
    differ from what they hold (their `JobWait` rows, in one statement on PostgreSQL)."""
    result = PassResult()
    t0, cpu0 = time.perf_counter(), time.thread_time()
    with db.session() as session:
        _take_pass_lock(session, holder or pass_holder())
        now = utcnow()
        t_lock = time.perf_counter()
        snapshot, rows = _load(session, now)
        t_read = time.perf_counter()
        decision = P.schedule(snapshot, config=config or P.PolicyConfig())
        result.violations = check(snapshot, decision)
        t_policy = time.perf_counter()
        if result.violations:
            log.error("scheduling pass refused a decision that breaks invariants: %s", result.violations)
            return result
        svc = JobLifecycle(session)
        status = {job_id: row.status for job_id, row in rows.items()}  # as this pass leaves them
        for job_id, reason in decision.preempt:
            new = svc.preempt(job_id, reason)
            if new is not None:
                status[job_id] = new
                result.preempted.append(job_id)
        for r in decision.resize:  # before the admissions: a shrink frees GPUs they may use
            if status[r.job_id] in _RESIZABLE and _apply_resize(session, r, now):
                result.resized.append(r.job_id)
        for job_id, placement in decision.admit:
            pool = rows[job_id].pool
            if not svc.transition(
                job_id,
                JobStatus.ADMITTED,
                expected_from=JobStatus.QUEUED,
                reason=f"admitted on pool {pool}: {_describe(placement)}",
            ):
                continue
            status[job_id] = JobStatus.ADMITTED
            session.add_all(_allocation_rows(job_id, placement.assignments))
            # admitted at its spec's count: an earlier run's resize and its driver's wish are over
            if rows[job_id].elastic:
                gpus = sum(g for _, g in placement.node_gpus)
                session.execute(
                    sa.update(Job)
                    .where(Job.id == job_id)
                    .values(total_gpus=gpus, rollout_wish=None, rollout_wish_reason=None)
                )
            result.admitted.append(job_id)
            after_commit(session, lambda j=job_id, p=pool: dispatcher.launch(j, p))
        if result.admitted:
            session.execute(sa.delete(JobWait).where(JobWait.job_id.in_(result.admitted)))
        changes = []
        # a pass re-issues every nomination it keeps; the rest lapse
        for job_id, row in rows.items():
            if status[job_id] != JobStatus.QUEUED:
                continue
            reason, position = row.wait_reason, row.queue_position
            info = decision.waiting.get(job_id)
            if info is not None:
                reason, position = info.reason, info.position
                result.waiting[job_id] = reason
            nominated = sorted(decision.nominate.get(job_id, ())) or None
            if (reason, position, nominated) != (
                row.wait_reason,
                row.queue_position,
                row.nominated_nodes or None,
            ):
                changes.append(
                    {
                        "id": job_id,
                        "wait_reason": reason,
                        "queue_position": position,
                        "nominated_nodes": nominated,
                    }
                )
        if changes:
            _write_waits(session, changes)
    t_end = time.perf_counter()
    # One line a pass, for operators and bench/api_load.py: how long it took (and how much of it this thread
    # ran on a CPU: on a busy machine the rest is waiting for one), over how many jobs.
    log.info(
        "scheduling pass: jobs=%d queued=%d ms=%.1f cpu_ms=%.1f (lock %.1f, read %.1f, policy %.1f, write %.1f) "
        "admitted=%d preempted=%d changed=%d",
        len(snapshot.jobs),
        len(decision.waiting) + len(decision.admit),
        (t_end - t0) * 1000,
        (time.thread_time() - cpu0) * 1000,
        (t_lock - t0) * 1000,
        (t_read - t_lock) * 1000,
        (t_policy - t_read) * 1000,
        (t_end - t_policy) * 1000,
        len(result.admitted),
        len(result.preempted),
        len(changes),
    )
    observe_pass(t_end - t0)  # relax_scheduling_pass_duration_seconds (scheduler/observability.py)
    if result.admitted or result.preempted or result.resized:
        log.info(
            "scheduling pass admitted %s preempted %s resized %s",
            result.admitted,
            result.preempted,
            result.resized,
        )
    return result


def _apply_resize(session: Session, r: Resize, now: datetime) -> bool:
    """Write one `Decision.resize`: the role's allocation rows become the pass's placement of it (the
    allocation is the placement: the driver follows these rows, `scheduler.services.elastic.rollout_grant`),
    the job's GPUs its new total, and an event says why. The allocation gets a new number (`Job.rollout_grant`);
    the GPUs it takes back keep a row per engine, `released_in` that number, until the driver reports it has
    followed it (`scheduler.services.elastic.release_followed`): held, no job is placed where those engines may
    still run.
    The run's attained service counts the GPUs it held until now at the old total (`service_gpu_s` is settled
    with the run's last total when it ends, so the difference is settled here)."""
    row = session.execute(
        sa.select(Job.total_gpus, Job.launched_at, Job.service_gpu_s, Job.rollout_grant).where(
            Job.id == r.job_id
        )
    ).one_or_none()
    if row is None:
        return False
    total = demand_gpus(r.demand)
    grant = (row.rollout_grant or 0) + 1  # this allocation's number: the driver reports it once it runs it
    values: dict[str, Any] = {"total_gpus": total, "rollout_grant": grant}
    if row.launched_at is not None:
        held_s = max(0.0, (now - row.launched_at).total_seconds())
        values["service_gpu_s"] = row.service_gpu_s + held_s * (row.total_gpus - total)
    session.execute(sa.update(Job).where(Job.id == r.job_id).values(**values))
    granted = (
        Allocation.job_id == r.job_id,
        Allocation.role == r.role,
        Allocation.released_in.is_(None),
        sa.not_(Allocation.shared),
    )
    had: dict[tuple[str, str], int] = {}
    for pool, node, gpus in session.execute(
        sa.select(Allocation.pool, Allocation.node, Allocation.gpus).where(*granted)
    ):
        had[(pool, node)] = had.get((pool, node), 0) + gpus
    session.execute(sa.delete(Allocation).where(*granted))
    rows = _allocation_rows(r.job_id, (a for a in r.placement.assignments if a.role == r.role))
    session.add_all(rows)
    for row in rows:
        had[(row.pool, row.node)] = had.get((row.pool, row.node), 0) - row.gpus
    taken = {key: gpus for key, gpus in sorted(had.items()) if gpus > 0}
    per_engine = next(g.gpus for g in r.demand if g.role == r.role)
    session.add_all(  # a row per engine taken back (an elastic engine sits on one node)
        Allocation(
            job_id=r.job_id, pool=pool, node=node, role=r.role, replica=-1, gpus=per_engine, released_in=grant
        )
        for (pool, node), gpus in taken.items()
        for _ in range(gpus // per_engine)
    )
    engines = abs(r.after - r.before)
    if r.after == r.before:  # taken back and granted elsewhere in one pass
        did = "moved engines"
    else:
        did = f"{'took back' if r.after < r.before else 'granted'} {engines} engine{'' if engines == 1 else 's'}"
    where = _describe(P.Placement(tuple(a for a in r.placement.assignments if a.role == r.role)))
    if taken:
        where += "; held until the driver has stopped the engines on " + ", ".join(
            f"{node} ({gpus} GPU{'' if gpus == 1 else 's'})" for (_, node), gpus in taken.items()
        )
    session.add(
        JobEvent(
            job_id=r.job_id,
            kind=RESIZE_EVENT,
            reason=f"{r.role} {r.before} -> {r.after}: the pass {did} ({r.reason}); now {where}",
            time=now,
        )
    )
    return True


# A queued job's `JobWait`, inserted or updated, unless the job left QUEUED meanwhile (cancelled by a request
# while the pass ran): one statement for all of them on PostgreSQL (arrays unnested), one a job elsewhere.
_UPSERT_WAITS_PG = sa.text(
    "INSERT INTO job_waits (job_id, queue_position, wait_reason, nominated_nodes) "
    "SELECT j.id, v.position, v.reason, CAST(v.nominated AS jsonb) "
    "FROM unnest(CAST(:ids AS text[]), CAST(:positions AS integer[]), CAST(:reasons AS text[]), "
    "CAST(:nominated AS text[])) AS v(id, position, reason, nominated) "
    "JOIN jobs j ON j.id = v.id AND j.status = :queued "
    "ON CONFLICT (job_id) DO UPDATE SET queue_position = excluded.queue_position, "
    "wait_reason = excluded.wait_reason, nominated_nodes = excluded.nominated_nodes"
)
_UPSERT_WAIT = sa.text(
    "INSERT INTO job_waits (job_id, queue_position, wait_reason, nominated_nodes) "
    "SELECT id, :queue_position, :wait_reason, :nominated_nodes FROM jobs WHERE id = :id AND status = :queued "
    "ON CONFLICT (job_id) DO UPDATE SET queue_position = excluded.queue_position, "
    "wait_reason = excluded.wait_reason, nominated_nodes = excluded.nominated_nodes"
).bindparams(sa.bindparam("nominated_nodes", type_=sa.JSON()))


def _allocation_rows(job_id: str, assignments: Iterable[P.Assignment]) -> list[Allocation]:
    """The allocation rows of a job's assignments (each on `pool/node`): what an admission and a resize write."""
    rows = []
    for a in assignments:
        pool_name, _, node = a.node.partition("/")
        rows.append(
            Allocation(
                job_id=job_id,
                pool=pool_name,
                node=node,
                role=a.role,
                replica=a.replica,
                gpus=a.gpus,
                shared=a.shared,
            )
        )
    return rows


def _write_waits(session: Session, changes: list[dict[str, Any]]) -> None:
    """Write the queued jobs' changed `JobWait`s (`id`, `queue_position`, `wait_reason`, `nominated_nodes`)."""
    queued = JobStatus.QUEUED.value
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            _UPSERT_WAITS_PG,
            {
                "ids": [c["id"] for c in changes],
                "positions": [c["queue_position"] for c in changes],
                "reasons": [c["wait_reason"] for c in changes],
                "nominated": [
                    None if c["nominated_nodes"] is None else json.dumps(c["nominated_nodes"])
                    for c in changes
                ],
                "queued": queued,
            },
        )
    else:
        session.execute(_UPSERT_WAIT, [{**c, "queued": queued} for c in changes])


def _describe(placement: P.Placement) -> str:
    own = [a for a in placement.assignments if not a.shared]
    return ", ".join(f"{a.role}[{a.replica}] {a.gpus} on {a.node.partition('/')[2]}" for a in own)


def holding_jobs(session: Session) -> list[Job]:
    return list(session.scalars(sa.select(Job).where(Job.status.in_(list(HOLDING_SLOTS)))))


def main(argv: list[str] | None = None) -> None:
    """`python -m scheduler.scheduling [--passes N]`: run passes now against the configured database
    and broker (RELAX_* settings) and print what they did as JSON lines. An operator's tool, and how
    tests run two schedulers at once."""
    import argparse
    import json

    from scheduler.dispatch import CeleryDispatcher
    from scheduler.settings import get_settings

    ap = argparse.ArgumentParser(prog="python -m scheduler.scheduling", description=main.__doc__)
    ap.add_argument("--passes", type=int, default=1)
    args = ap.parse_args(argv)
    settings = get_settings()
    db = Database(settings.database_url)
    dispatcher = CeleryDispatcher(make_celery(settings))
    try:
        for _ in range(args.passes):
            r = run_scheduling_pass(db, dispatcher)
            print(
                json.dumps(
                    {
                        "admitted": r.admitted,
                        "preempted": r.preempted,
                        "violations": r.violations,
                        "waiting": len(r.waiting),
                    }
                ),
                flush=True,
            )
    finally:
        db.dispose()


if __name__ == "__main__":
    main()
