"""Celery tasks: the scheduling pass, and per pool the launch, stop and reconcile of Ray jobs.

Every task takes ids only, re-reads what it needs and changes status by compare-and-set, so running
a task twice (a redelivery after a worker died) is harmless.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property

import sqlalchemy as sa
from celery import Celery, signals

from runtime.launcher import RayJobInfo, RayJobLauncher, driver_entrypoint, launcher_for, submission_id
from runtime.redaction import redact
from runtime.spool import spool_dir
from scheduler import health, recovery
from scheduler.db.engine import Database
from scheduler.db.models import Job, Pool, utcnow
from scheduler.dispatch import (
    SCHEDULER_QUEUE,
    TASK_LAUNCH,
    TASK_PASS,
    TASK_RECONCILE,
    TASK_STOP,
    TASK_TICK,
    CeleryDispatcher,
    PassCoalescer,
)
from scheduler.domain.jobs import ON_CLUSTER, FailureReason, JobStatus
from scheduler.domain.reconcile import Fact, Facts, Move, MoveKind, Need, decide
from scheduler.logs import annotate, log_context
from scheduler.memory import freeze_startup_objects
from scheduler.observability import observe_ray
from scheduler.scheduling import PassResult, run_scheduling_pass
from scheduler.services import webhook_delivery, webhooks
from scheduler.services.job_tokens import bootstrap_secret
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.platform import NodeSync, sync_ray_nodes
from scheduler.services.reports import JobReports
from scheduler.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    """What tasks share inside one worker process; built on first use, not at import."""

    settings: Settings
    app: Celery
    started_at: datetime = field(default_factory=utcnow)  # a driver's silence is counted from here at most

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.database_url)

    @cached_property
    def dispatcher(self) -> CeleryDispatcher:
        return CeleryDispatcher(self.app)

    @cached_property
    def webhook_pool(self) -> webhook_delivery.DeliveryPool:
        """The threads that make this process's webhook attempts."""
        return webhook_delivery.DeliveryPool(
            self.db, self.settings.webhooks, signing_key=self.settings.signing_key()
        )

    @cached_property
    def passes(self) -> PassCoalescer:
        """The passes of this process: requests that come while one runs share the next."""
        return PassCoalescer(
            lambda: run_scheduling_pass(self.db, self.dispatcher),
            self.settings.scheduler.pass_interval_seconds,
            self.settings.scheduler.pass_duty,
        )


def register_tasks(app: Celery, settings: Settings) -> WorkerContext:
    ctx = WorkerContext(settings=settings, app=app)

    @app.task(name=TASK_PASS)
    def scheduling_pass() -> list[str]:
        result = ctx.passes.request()
        return result.admitted if isinstance(result, PassResult) else []

    @app.task(name=TASK_TICK)
    def tick() -> None:
        health.record(ctx.db, health.TICK, f"{socket.gethostname()} pid {os.getpid()}")  # for /readyz
        ctx.passes.request()
        relaunch_stalled(ctx)
        with ctx.db.session() as s:
            pools = set(s.scalars(sa.select(Job.pool).where(Job.status.in_(list(ON_CLUSTER)))))
            # every pool on a Ray cluster: its nodes follow Ray's node list (`sync_pool_nodes`)
            pools |= set(s.scalars(sa.select(Pool.name).where(Pool.ray_address.is_not(None))))
        for pool in sorted(pools):
            ctx.dispatcher.reconcile(pool)
        try:  # webhook messages due: a hand-off lost, a retry's time come, an attempt lost with its worker
            webhook_delivery.sweep(ctx.db, ctx.settings.webhooks, send_webhook)
            webhook_delivery.prune(ctx.db, ctx.settings.webhooks)
        except Exception:  # noqa: BLE001 - the next tick sweeps again; the rest of the tick has run
            log.exception("the sweep of due webhook deliveries failed")

    def send_webhook(delivery_id: str) -> None:
        app.send_task(webhook_delivery.TASK_DELIVER, args=[delivery_id], queue=SCHEDULER_QUEUE)

    @app.task(name=webhook_delivery.TASK_DELIVER)
    def deliver_webhook(delivery_id: str) -> None:
        ctx.webhook_pool.submit(delivery_id)  # the attempt runs on the process's webhook threads

    @app.task(name=TASK_LAUNCH)
    def launch(job_id: str) -> None:
        with log_context(job_id=job_id):
            launch_job(ctx, job_id)

    @app.task(name=TASK_STOP)
    def stop(job_id: str) -> None:
        with log_context(job_id=job_id):
            _stop(ctx, job_id)

    @app.task(name=TASK_RECONCILE)
    def reconcile(pool: str) -> None:
        with log_context():
            sync_pool_nodes(ctx, pool)
            reconcile_pool(ctx, pool)

    def start_heartbeat(sender: object = None, **_: object) -> None:
        """In a worker process, once it consumes: its heartbeat row, every `heartbeat_seconds` (/readyz)."""
        if sender is None or getattr(sender, "app", None) is not app:
            return
        nodename = str(getattr(sender, "hostname", None) or socket.gethostname())
        ctx.__dict__["heartbeat"] = health.WorkerHeartbeat(
            ctx.db, nodename, ctx.settings.scheduler.heartbeat_seconds
        ).start()

    def start_sending_webhooks(sender: object = None, **_: object) -> None:
        """In a worker process: status changes committed here hand their webhook deliveries to a task at once."""
        if sender is not None and getattr(sender, "app", None) is app:
            webhooks.set_sender(send_webhook)

    signals.worker_ready.connect(start_heartbeat, weak=False)
    signals.worker_ready.connect(start_sending_webhooks, weak=False)
    signals.worker_ready.connect(lambda **_: freeze_startup_objects(), weak=False)
    return ctx


LAUNCH_RETRY_SECONDS = 2.0  # while the pool's Ray does not answer, for at most launch_grace_seconds
ADMITTED_RELAUNCH_SECONDS = 10.0  # an ADMITTED job's launch task is taken within a second when all is well


def _stop(ctx: WorkerContext, job_id: str) -> None:
    """Stop the job's Ray job (a cancel or a preemption), then reconcile its pool."""
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.ray_submission_id is None or job.status.is_terminal():
            return
        pool = s.get(Pool, job.pool)
        address, sub_id = pool.ray_address if pool else None, job.ray_submission_id
    if address:
        launcher_for(address, ctx.settings.ray_token(job.pool)).stop(sub_id)
    ctx.dispatcher.reconcile(job.pool)


def relaunch_stalled(ctx: WorkerContext, *, older_than: float = ADMITTED_RELAUNCH_SECONDS) -> list[str]:
    """Send the launch task again for every job ADMITTED more than `older_than` s ago: its first one never
    reached a worker (the broker was away when the pass committed, or a worker was SIGKILLed holding the
    message: the embedded SQL transport does not hand back what a killed worker had taken), and it would
    otherwise hold its slots forever (the reconciler watches jobs from STARTING on). A launch is idempotent:
    compare-and-set ADMITTED -> STARTING, one Ray job per attempt. Returns the jobs."""
    now = utcnow()
    with ctx.db.session(read_only=True) as s:
        rows = s.execute(
            sa.select(Job.id, Job.pool, Job.status_changed_at).where(Job.status == JobStatus.ADMITTED)
        ).all()
    stalled = [(j, pool) for j, pool, at in rows if (now - at).total_seconds() > older_than]
    for job_id, pool in stalled:
        log.warning("job %s is ADMITTED since over %.0fs: sending its launch again", job_id, older_than)
        ctx.dispatcher.launch(job_id, pool)
    return [j for j, _ in stalled]


def launch_job(ctx: WorkerContext, job_id: str) -> None:
    """ADMITTED -> STARTING, then submit the driver as a Ray job (again, if a worker died mid-way)."""
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        job = s.get(Job, job_id)
        if job is None:
            return
        if job.status == JobStatus.ADMITTED:
            if not svc.transition(
                job_id,
                JobStatus.STARTING,
                expected_from=JobStatus.ADMITTED,
                reason="submitting the driver to Ray",
            ):
                return
            job.ray_submission_id = submission_id(job_id, job.attempt)
        elif job.status != JobStatus.STARTING:
            return  # cancelled meanwhile, or a duplicate delivery after the driver came up
        pool = s.get(Pool, job.pool)
        assert pool is not None
        address, python, attempt, sub_id = (
            pool.ray_address,
            pool.python or sys.executable,
            job.attempt,
            job.ray_submission_id,
        )
    pool_name = job.pool
    patience = ctx.settings.scheduler.launch_grace_seconds if _ray_supervised(pool_name) else 0.0
    deadline = time.monotonic() + patience
    while True:
        try:
            if not address:
                raise RuntimeError(f"pool {pool_name} has no Ray address")
            # Ray's Jobs API shows a job's environment to anyone who can reach the dashboard: it carries
            # only the attempt's one-time bootstrap secret, which the driver exchanges for the attempt's
            # token as its first call (scheduler/services/job_tokens.py); a copy read later is refused.
            bootstrap = bootstrap_secret(ctx.settings.signing_key(), job_id, attempt)
            launcher = launcher_for(address, ctx.settings.ray_token(pool_name))
            _end_earlier_attempts(launcher, job_id, attempt)
            submitted = launcher.submit(
                sub_id,
                driver_entrypoint(python, job_id, ctx.settings.public_url),
                env={
                    "RELAX_JOB_ID": job_id,
                    "RELAX_JOB_BOOTSTRAP": bootstrap,
                    "RELAX_JOB_ATTEMPT": str(attempt),
                },
                metadata={"relax_job_id": job_id, "attempt": str(attempt)},
            )
            log.info(
                "job %s attempt %s %s on %s",
                job_id,
                attempt,
                "submitted" if submitted else "already on Ray",
                address,
            )
            _stop_if_moved_on(ctx, launcher, job_id, attempt, sub_id)
            return
        except OSError as err:  # the pool's Ray does not answer (refused, reset)
            if time.monotonic() >= deadline:
                _launch_failed(ctx, job_id, address, err)
                return
            # The embedded platform's Ray is being restarted by its supervisor: it comes back on new ports,
            # which the supervisor records on the pool, so read the address again. Before this, a launch
            # during a Ray restart FAILED the job as `setup` (chaos trials).
            log.warning(
                "job %s: the pool's Ray at %s does not answer (%s); trying again", job_id, address, err
            )
            time.sleep(LAUNCH_RETRY_SECONDS)
            with ctx.db.session(read_only=True) as s:
                job = s.get(Job, job_id)
                if job is None or job.status != JobStatus.STARTING or job.attempt != attempt:
                    return  # cancelled meanwhile, or moved on: the reconciler has it
                pool = s.get(Pool, pool_name)
                address = pool.ray_address if pool else None
        except Exception as err:  # the cluster refused the job
            _launch_failed(ctx, job_id, address, err)
            return


# One driver per job at a time. A submission can take seconds to answer (Ray's dashboard starting again after a
# restart), and meanwhile the job can move on: preempted, its Ray job found gone, requeued and admitted as the
# next attempt (a chaos trial: Ray killed while the job was queued; attempt 1's submission answered 4.5 s later,
# after attempt 2's admission, and both drivers ran). Each launch therefore ends what an earlier attempt's late
# submission left on Ray before it submits its own, and a launch whose job moved on while it was submitting stops
# what it submitted.
EARLIER_ATTEMPT_STOP_SECONDS = 10.0


def _end_earlier_attempts(launcher: RayJobLauncher, job_id: str, attempt: int) -> None:
    """Stop every earlier attempt's Ray job that is not over and wait (at most EARLIER_ATTEMPT_STOP_SECONDS) until
    Ray says it is over: normally each ended before its attempt was requeued, and this costs a status call each."""
    for earlier in range(1, attempt):
        sub = submission_id(job_id, earlier)
        try:
            info = launcher.status(sub)
        except OSError:
            raise  # Ray does not answer: the launch tries again
        except Exception as err:  # noqa: BLE001 - an answer it cannot read: the attempt's driver is fenced anyway
            log.warning("job %s: attempt %s's Ray job %s: %s", job_id, earlier, sub, err)
            continue
        if info is None or info.status.is_terminal():
            continue
        log.warning(
            "job %s: attempt %s's Ray job %s is still %s: stopping it first",
            job_id,
            earlier,
            sub,
            info.status,
        )
        launcher.stop(sub)
        deadline = time.monotonic() + EARLIER_ATTEMPT_STOP_SECONDS
        while time.monotonic() < deadline:
            info = launcher.status(sub)
            if info is None or info.status.is_terminal():
                break
            time.sleep(0.2)


def _stop_if_moved_on(
    ctx: WorkerContext, launcher: RayJobLauncher, job_id: str, attempt: int, sub_id: str
) -> None:
    """Stop the Ray job just submitted when its job is no longer this attempt's STARTING or RUNNING one."""
    with ctx.db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        current = (
            job is not None
            and job.attempt == attempt
            and job.status in (JobStatus.STARTING, JobStatus.RUNNING)
        )
    if not current:
        log.warning(
            "job %s moved on while its attempt %s was submitted: stopping Ray job %s", job_id, attempt, sub_id
        )
        launcher.stop(sub_id)


EMBEDDED_POOL = "local"  # the pool whose Ray the embedded platform's supervisor runs (api/embedded.py)


def _ray_supervised(pool: str) -> bool:
    """Whether `pool`'s Ray is the embedded platform's own, which its supervisor restarts when it dies (a
    `ray` part in the supervisor's state): a launch that finds it down waits for it instead of failing."""
    state = health.read_supervisor_state(os.environ.get(health.SUPERVISOR_STATE_ENV))
    return pool == EMBEDDED_POOL and bool(state and "ray" in (state.get("parts") or {}))


def _ray_restarted_since(pool: str, when: datetime) -> bool:
    """Whether `pool`'s Ray is the embedded platform's own and its head (re)started after `when` (the
    supervisor's state: the `ray` part running since then)."""
    if pool != EMBEDDED_POOL:
        return False
    state = health.read_supervisor_state(os.environ.get(health.SUPERVISOR_STATE_ENV))
    ray = ((state or {}).get("parts") or {}).get("ray") or {}
    since = ray.get("since")
    return ray.get("state") == "running" and bool(since) and float(since) > when.timestamp()


def _launch_failed(ctx: WorkerContext, job_id: str, address: str | None, err: Exception) -> None:
    log.error("launch of %s failed", job_id, exc_info=err)
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(
            job_id,
            JobStatus.FAILED,
            expected_from=JobStatus.STARTING,
            reason=redact(f"could not submit to Ray at {address}: {err}"),
            failure=FailureReason.SETUP,
        )
        svc.transition(
            job_id,
            JobStatus.CANCELLED,
            expected_from=JobStatus.CANCELLING,
            reason="cancelled before the driver started",
        )
    ctx.dispatcher.request_pass()


def sync_pool_nodes(ctx: WorkerContext, pool_name: str) -> NodeSync | None:
    """The pool's nodes in step with its Ray cluster's node list (`platform.sync_ray_nodes`): a node Ray lost is
    marked down and a pass asked for, which requeues its jobs to resume from their latest checkpoint. None when
    the pool has no Ray address or its Ray does not answer (its nodes are left as they are: the reconciler
    judges the drivers by their reports)."""
    with ctx.db.session(read_only=True) as s:
        pool = s.get(Pool, pool_name)
        address = pool.ray_address if pool is not None else None
    if not address:
        return None
    try:
        ray_nodes = launcher_for(address, ctx.settings.ray_token(pool_name)).nodes()
    except Exception as err:  # noqa: BLE001 - Ray down or restarting: next tick
        log.warning("pool %s: Ray's node list at %s is not available: %s", pool_name, address, err)
        return None
    with ctx.db.session() as s:
        change = sync_ray_nodes(s, pool_name, ray_nodes)
    if change.down:
        log.warning(
            "pool %s: Ray lost node(s) %s: marked down, their jobs requeued", pool_name, list(change.down)
        )
    if change.added or change.up:
        log.info("pool %s: node(s) added %s, back up %s", pool_name, list(change.added), list(change.up))
    if change.skipped:
        log.warning(
            "pool %s: Ray node(s) %s not added: the pool has nodes registered by names Ray does not use",
            pool_name,
            list(change.skipped),
        )
    if change.down or change.added or change.up:
        ctx.dispatcher.request_pass()
    return change


@dataclass(frozen=True)
class _Watched:
    """An on-cluster job as the reconciler read it."""

    id: str
    status: JobStatus
    sub_id: str | None
    launched_at: datetime | None
    changed_at: datetime
    all_steps_done: bool


def reconcile_pool(ctx: WorkerContext, pool_name: str) -> None:
    """Compare each on-cluster job with its Ray job and move it on; frees slots of ended jobs. What to do is the
    reconcile table's (scheduler/domain/reconcile.py); this reads the jobs, asks Ray, gathers the facts the
    table asks for and performs its move."""
    with ctx.db.session() as s:
        pool = s.get(Pool, pool_name)
        if pool is None or not pool.ray_address:
            return
        address = pool.ray_address
        jobs = [
            _Watched(
                j.id,
                j.status,
                j.ray_submission_id,
                j.launched_at,
                j.status_changed_at,
                j.total_steps is not None and (j.progress_step or 0) >= j.total_steps,
            )
            for j in s.scalars(sa.select(Job).where(Job.pool == pool_name, Job.status.in_(list(ON_CLUSTER))))
        ]
    try:
        launcher = launcher_for(address, ctx.settings.ray_token(pool_name))
    except Exception as err:  # the pool's Ray does not answer: its drivers are judged by their reports
        observe_ray(pool_name, answered=False)
        log.warning("pool %s: Ray at %s does not answer: %s", pool_name, address, err)
        lost = [_reconcile_job(ctx, None, pool_name, address, job, None, ray_error=str(err)) for job in jobs]
        if any(lost):
            ctx.dispatcher.request_pass()
        return
    observe_ray(pool_name, answered=True)
    freed = False
    for job in jobs:
        annotate(job_id=job.id)  # the task's context (`reconcile`): this job's lines name it
        try:
            info = launcher.status(job.sub_id) if job.sub_id else None
        except Exception as err:  # noqa: BLE001 - as above, for this job
            observe_ray(pool_name, answered=False)
            freed |= _reconcile_job(ctx, launcher, pool_name, address, job, None, ray_error=str(err))
            continue
        freed |= _reconcile_job(ctx, launcher, pool_name, address, job, info)
    annotate(job_id=None)
    if freed:
        ctx.dispatcher.request_pass()


def _reconcile_job(
    ctx: WorkerContext,
    launcher: RayJobLauncher | None,
    pool_name: str,
    address: str,
    job: _Watched,
    info: RayJobInfo | None,
    *,
    ray_error: str | None = None,
) -> bool:
    """One job through the reconcile table: the facts it asks for, one at a time in its order, then its move.
    Returns whether the job moved (its slots may be free)."""
    if job.status in (JobStatus.STARTING, JobStatus.RUNNING) and info is not None and recovery.settling(info):
        return False  # its actor was lost: the node sync first (`recovery.ACTOR_LOSS_SETTLE_SECONDS`)
    preempt_grace = timedelta(seconds=ctx.settings.scheduler.preempt_grace_seconds)
    facts = Facts(
        ours=job.status,
        ray=info.status if info is not None else None,
        address=address,
        sub_id=job.sub_id,
        ray_error=ray_error,
        ray_message=info.message if info is not None else None,
        all_steps_done=job.all_steps_done,
        preempt_grace_passed=utcnow() - job.changed_at > preempt_grace,
    )
    while isinstance(step := decide(facts), Need):
        facts = _gather(ctx, launcher, pool_name, job, info, facts, step.fact)
    return _perform(ctx, launcher, job, step)


def _gather(
    ctx: WorkerContext,
    launcher: RayJobLauncher | None,
    pool_name: str,
    job: _Watched,
    info: RayJobInfo | None,
    facts: Facts,
    fact: Fact,
) -> Facts:
    """Find out one fact the reconcile table asks for (the I/O behind it)."""
    match fact:
        case Fact.LATE:  # past the launch grace, or launched before the pool's (embedded) Ray head restarted
            grace = timedelta(seconds=ctx.settings.scheduler.launch_grace_seconds)
            late = (
                job.launched_at is None
                or utcnow() - job.launched_at > grace
                or _ray_restarted_since(pool_name, job.launched_at)
            )
            return replace(facts, late=late)
        case Fact.DRIVER_STARTED:
            return replace(facts, driver_started=_driver_started(ctx, job.id))
        case Fact.RUN_END:
            final, done = _collect_run_end(ctx, job.id, facts.all_steps_done)
            return replace(facts, final_stored=final, all_steps_done=done)
        case Fact.FINISHED_CLEANLY:
            return replace(facts, finished_cleanly=recovery.finished_cleanly(ctx.db, job.id))
        case Fact.SILENCE:
            return replace(facts, silence=_silence(ctx, job.id))
        case Fact.API_ANSWERS:
            return replace(facts, api_answers=_api_answers(ctx))
        case Fact.LOG_TAIL:
            assert launcher is not None and job.sub_id is not None
            return replace(facts, log_tail=tuple(launcher.logs_tail(job.sub_id)))
        case Fact.VERDICT:
            assert info is not None and job.sub_id is not None
            return replace(facts, verdict=recovery.judge_ended(job.sub_id, info))
    raise AssertionError(f"no way to learn {fact}")


def _perform(ctx: WorkerContext, launcher: RayJobLauncher | None, job: _Watched, move: Move) -> bool:
    """Carry out the reconcile table's move for the job. Returns whether the job moved."""
    tail = list(move.log_tail) or None
    match move.kind:
        case MoveKind.NOTHING:
            return False
        case MoveKind.STOP_RAY_JOB:
            assert launcher is not None and job.sub_id is not None
            launcher.stop(job.sub_id)
            return False
        case MoveKind.RELAUNCH:
            launch_job(ctx, job.id)  # the worker that launched it died before submitting
            return False
        case MoveKind.AWAIT_FINAL_REPORT:
            return _await_final_report(ctx, job.id, job.status)
        case MoveKind.MOVE:
            assert move.to is not None
            return _move(ctx, job.id, job.status, move.to, move.reason, failure=move.failure, log_tail=tail)
        case MoveKind.MARK_LOST:
            if move.stop_first:
                assert launcher is not None and job.sub_id is not None
                launcher.stop(job.sub_id)
            return _lost(ctx, job.id, job.status, move.reason, log_tail=tail)
    raise AssertionError(f"no way to perform {move.kind}")


def _collect_run_end(ctx: WorkerContext, job_id: str, all_steps_done: bool) -> tuple[bool, bool]:
    """The driver's Ray job has ended: apply the reports it left in its spool (the API was down when it
    ended), reconcile the checkpoint records with the files, and say whether its final report is stored
    and whether it trained every step (progress may have come from the spool just now)."""
    collected = None
    with ctx.db.session() as s:
        reports = JobReports(s)
        job = s.get(Job, job_id)
        if job is None or job.status not in ON_CLUSTER:
            return False, all_steps_done
        try:
            with s.begin_nested():
                collected = reports.collect_spool(job, ctx.settings.signing_key())
            if collected.applied or collected.problem:
                log.info("job %s: %s", job_id, collected.summary(job.attempt))
        except Exception:  # noqa: BLE001 - never let one job's spool stop the pool's reconciler
            log.exception("job %s: collecting the report spool failed", job_id)
        try:
            with s.begin_nested():
                reports.reconcile_checkpoints(job)
        except Exception:  # noqa: BLE001
            log.exception("job %s: reconciling checkpoints with the disk failed", job_id)
        s.refresh(job)
        done = job.total_steps is not None and (job.progress_step or 0) >= job.total_steps
        final = reports.final_report_stored(job)
    if collected is not None and collected.complete:
        collected.discard()  # stored and committed: the spool's job is done
    return final, done


def _await_final_report(ctx: WorkerContext, job_id: str, src: JobStatus) -> bool:
    """The Ray job ended without error but the driver's final report is not stored: the job keeps its
    status (its reason says it waits) for `final_report_grace_seconds`, collecting the spool on each pass;
    then it FAILED (`lost`), saying so. Returns whether it moved."""
    grace = timedelta(seconds=ctx.settings.scheduler.final_report_grace_seconds)
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return False
        since = JobReports(s).awaiting_final_report_since(job)
        if utcnow() - since < grace:
            return False
        reason = (
            f"the driver's Ray job ended without error, but its final report never reached the platform in "
            f"{grace.total_seconds():.0f}s (last stored report seq {job.report_seq}); what it could not "
            f"deliver stays in {spool_dir(job.output_dir, job.attempt)}"
        )
        return JobLifecycle(s).transition(
            job_id, JobStatus.FAILED, expected_from=src, reason=reason, failure=FailureReason.LOST
        )


def _lost(
    ctx: WorkerContext, job_id: str, src: JobStatus, why: str, *, log_tail: list[str] | None = None
) -> bool:
    """The job's driver is lost: requeued to resume from its checkpoint, or FAILED past its restart limit
    (scheduler/recovery.py). Returns whether the job moved (its slots are then free). What the lost driver
    left in its spool is applied first: the next attempt's token could not deliver it (a repeat finds nothing
    new, where the run's end already collected it)."""
    _collect_run_end(ctx, job_id, False)
    moved = recovery.recover(
        ctx.db,
        job_id,
        src,
        why,
        default_limit=ctx.settings.scheduler.max_driver_restarts,
        log_tail=log_tail,
    )
    return moved is not None


def _driver_started(ctx: WorkerContext, job_id: str) -> bool:
    """Whether the job's current attempt got as far as exchanging its bootstrap secret (a relaunch of the
    same attempt would be refused)."""
    with ctx.db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        return job is not None and job.token_claimed_attempt == job.attempt


def _silence(ctx: WorkerContext, job_id: str) -> float | None:
    """Seconds since the job's driver was last heard of (its last report or heartbeat, its launch, or this
    worker's start, whichever is latest) when that is more than `driver_silence_seconds`; else None."""
    with ctx.db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        if job is None:
            return None
        heard = max(t for t in (job.last_report_at, job.launched_at, ctx.started_at) if t is not None)
    silence = (utcnow() - heard).total_seconds()
    return silence if silence > ctx.settings.scheduler.driver_silence_seconds else None


def _api_answers(ctx: WorkerContext) -> bool:
    """Whether the platform's API answers (`/healthz` at the URL drivers report to): a driver is judged
    silent only while it could have reported."""
    try:
        with urllib.request.urlopen(f"{ctx.settings.public_url.rstrip('/')}/healthz", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _move(
    ctx: WorkerContext,
    job_id: str,
    src: JobStatus,
    dst: JobStatus,
    reason: str,
    *,
    failure: FailureReason | None = None,
    log_tail: list[str] | None = None,
) -> bool:
    with ctx.db.session() as s:
        lifecycle = JobLifecycle(s)
        moved = lifecycle.transition(job_id, dst, expected_from=src, reason=reason, failure=failure)
        if moved and log_tail:
            job = lifecycle.get(job_id)
            JobReports(s).add_ray_log_tail(job, log_tail)
        return moved
