"""The driver's side of a job: the spec it runs (resumed from its latest checkpoint), the reports it sends
(metrics, logs, checkpoints, rollouts, predictions, events, progress), what it left in its spool when the
API could not take them, and whether its final report is stored (docs/reliability.md)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobspec.demand import PLACEMENT_KEY
from runtime.access import PATHS_KEY
from runtime.layout import (
    directory_size,
    folder_owner,
    is_complete_checkpoint,
    iteration_dir,
    list_iterations,
)
from runtime.redaction import redact
from runtime.report_protocol import EventKind, LogItem, Phase, Report
from runtime.spool import read_spool, spool_dir, spool_key
from scheduler.db.models import (
    Allocation,
    Checkpoint,
    Job,
    JobEvent,
    LogLine,
    Metric,
    Node,
    Pool,
    Prediction,
    Rollout,
    Team,
    utcnow,
)
from scheduler.domain.errors import Conflict, InvalidRequest
from scheduler.domain.jobs import ON_CLUSTER, JobStatus
from scheduler.observability import count_report
from scheduler.services.elastic import STOPPED_EVENT, WISH_EVENT, record_wish, release_followed
from scheduler.services.job_tokens import job_token
from scheduler.services.lifecycle import JobLifecycle, JobServiceBase
from scheduler.services.outputs import JobOutputs
from scheduler.services.paths import real, team_storage

FINAL_REPORT_EVENT = EventKind.FINAL_REPORT.value  # the driver's last report
AWAITING_FINAL_REPORT_EVENT = "awaiting_final_report"
WAITING_FOR_FINAL_REPORT = "the driver's Ray job ended; waiting for the driver's final reports"


@dataclass(frozen=True)
class SpoolCollection:
    """What `JobReports.collect_spool` found in an attempt's report spool."""

    location: str
    found: bool
    applied: int = 0  # stored now
    stored: int = 0  # stored before (delivered over HTTP, or collected already)
    left: int = 0  # not applied: see `problem`
    problem: str | None = None

    @property
    def complete(self) -> bool:
        """Every report in the spool is stored: it may go (after the transaction that stored them)."""
        return self.found and self.problem is None and not self.left

    def discard(self) -> None:
        shutil.rmtree(self.location, ignore_errors=True)

    def summary(self, attempt: int) -> str:
        text = f"attempt {attempt}: {self.applied} report(s) collected from the driver's spool at {self.location}"
        if self.problem:
            text += f"; {self.left} left there: {self.problem}"
        return text


@dataclass(frozen=True)
class CheckpointReconciliation:
    registered: list[int]  # steps of complete checkpoints on disk registered now
    missing: list[str]  # paths of records removed: their folders are gone


def _ts(value: float | None) -> datetime:
    return datetime.fromtimestamp(value, UTC) if value is not None else utcnow()


class JobReports(JobServiceBase):
    """What a job's driver gets and sends: its spec, and its reports applied in sequence, once each."""

    def __init__(
        self, session: Session, *, artifact_root: Path | None = None, home: Path | None = None
    ) -> None:
        super().__init__(session)
        # the platform's home and artifact root: with them, the spec names the roots a driver may open
        self.artifact_root = artifact_root
        self.home = home
        self._lifecycle = JobLifecycle(session)

    def driver_spec(self, job: Job) -> dict[str, Any]:
        """The spec a driver runs. A relaunched job (after preemption or a lost node) resumes from its
        latest checkpoint: `load` points at its own `save` when that holds a checkpoint."""
        spec = dict(job.spec)
        save = spec.get("save")
        if job.attempt > 1 and save:
            self.reconcile_checkpoints(job)  # the records say what is on disk before resuming from it
        if job.attempt > 1 and not spec.get("load") and save and self._has_checkpoint(job):
            spec["load"] = save
        if self.home is not None:  # what the driver may open, checked again there (runtime/access.py)
            spec[PATHS_KEY] = self._driver_paths(job)
        spec[PLACEMENT_KEY] = self.driver_placement(job)
        return spec

    def driver_placement(self, job: Job) -> list[dict[str, Any]]:
        """The job's allocations as the pass wrote them, each with its node's Ray node id: the driver pins each
        role's placement-group bundles there (`jobspec.demand.gpu_nodes`, runtime/roles/placement.py)."""
        rows = self.session.execute(
            sa.select(Allocation, Node.ray_node_id)
            .outerjoin(Node, sa.and_(Node.pool == Allocation.pool, Node.name == Allocation.node))
            # not the engines taken back that a driver still stops (an earlier attempt's, or this one's)
            .where(Allocation.job_id == job.id, Allocation.released_in.is_(None))
            .order_by(Allocation.id)
        )
        return [
            {
                "role": a.role,
                "replica": a.replica,
                "node": a.node,
                "ray_node_id": ray_node_id,
                "gpus": a.gpus,
                "shared": a.shared,
            }
            for a, ray_node_id in rows
        ]

    def _driver_paths(self, job: Job) -> dict[str, Any]:
        """The roots the job's driver may open: its team's area and grants in its pool as they are now, its
        own folder and those of the jobs it reads (`job://`); the platform's home and store denied."""
        team = self.session.get(Team, job.team_id)
        assert team is not None
        inputs = sorted({i["job_id"] for i in (job.submitted or {}).get("inputs", [])})
        folders = [real(job.output_dir)]  # its own (in the area, or where an older layout put it)
        for producer in self.session.scalars(
            sa.select(Job).where(Job.id.in_(inputs), Job.team_id == job.team_id)
        ):
            if real(producer.output_dir) not in folders:
                folders.append(real(producer.output_dir))
        if self.artifact_root is None:
            raise RuntimeError("JobReports needs the platform's artifact root with its home")
        pool = self.session.get(Pool, job.pool)
        storage = team_storage(
            self.session,
            home=self.home,
            artifact_root=self.artifact_root,
            team_id=team.id,
            team_name=team.name,
            pool=pool.name if pool is not None else None,
        )
        return storage.driver_policy(job.id, folders)

    def _has_checkpoint(self, job: Job) -> bool:
        count = self.session.scalar(
            sa.select(sa.func.count())
            .select_from(Checkpoint)
            .where(Checkpoint.job_id == job.id, Checkpoint.format != "hf")
        )
        return bool(count)

    def add_logs(self, job: Job, lines: Iterable[LogItem], *, source: str) -> None:
        """Log lines of the job's current attempt, redacted; `source` where a line names none."""
        rows = [
            {
                "job_id": job.id,
                "attempt": job.attempt,
                "time": _ts(line.get("time")),
                "level": str(line.get("level", "INFO"))[:10],
                "source": str(source if line.get("source") is None else line.get("source"))[:40],
                "message": redact(str(line.get("message", ""))),
            }
            for line in lines
        ]
        if rows:
            self.session.execute(sa.insert(LogLine), rows)

    def add_ray_log_tail(self, job: Job, lines: Iterable[str]) -> None:
        """The last lines of the driver's Ray job log, as the reconciler read them when the job ended or was lost."""
        self.add_logs(job, (LogItem(message=line, level="INFO") for line in lines), source="ray")

    # Driver reports ------------------------------------------------------------------------
    def ingest_report(self, job: Job, report: Report) -> bool:
        """Apply one report batch of the job's live attempt; returns whether the driver should stop.

        Sequence: a driver numbers its reports 0, 1, 2, … and resends a report unchanged (same seq)
        until it is acknowledged, with one report in flight at a time (runtime/reporter.py). So a new
        report is exactly `report_seq + 1`; one at or below `report_seq` is a resend of a report already
        applied and is acknowledged without effect; one further ahead never comes from the driver and
        is refused (422 `report.seq_gap`) without moving `report_seq`, so that no sender can make the
        platform skip the driver's later reports. `report_seq` moves by compare-and-set: two copies of
        one report sent at once are applied once. The report is validated (`Report`, over HTTP and from the
        spool alike), so each of its items holds every key of its declaration."""
        if report.attempt != job.attempt:
            raise Conflict(
                f"report for attempt {report.attempt} but the job is at attempt {job.attempt}",
                code="job.stale_attempt",
            )
        if job.status not in ON_CLUSTER:
            raise Conflict(
                f"job {job.id} is {job.status}: reports are accepted only from its live attempt",
                code="job.not_running",
            )
        if report.seq <= job.report_seq:
            return self._stop_requested(job)  # a resend of a batch already applied
        expected = job.report_seq + 1
        if report.seq != expected:
            raise InvalidRequest(
                f"report seq {report.seq} is ahead of the next expected seq {expected}",
                code="report.seq_gap",
                details={
                    "field": "seq",
                    "expected": expected,
                    "hint": "send reports in order, one at a time, resending a failed one unchanged",
                },
            )
        self.session.flush()
        moved = self.session.execute(
            sa.update(Job)
            .where(
                Job.id == job.id,
                Job.attempt == report.attempt,
                Job.report_seq == report.seq - 1,
                Job.status.in_(list(ON_CLUSTER)),
            )
            .values(report_seq=report.seq, last_report_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        self.session.refresh(job)
        if moved.rowcount != 1:  # applied meanwhile by a concurrent copy, or the job moved on
            if job.attempt == report.attempt and job.report_seq >= report.seq:
                return self._stop_requested(job)
            raise Conflict(f"job {job.id} changed while the report was applied; resend it", code="job.busy")
        count_report(len(report.metrics))  # relax_reports_ingested, relax_report_metric_points
        if report.progress:
            job.progress_step = report.progress.get("step", job.progress_step)
            job.total_steps = report.progress.get("total_steps", job.total_steps)
        attempt = job.attempt
        if report.metrics:
            self.session.execute(
                sa.insert(Metric),
                [
                    {
                        "job_id": job.id,
                        "attempt": attempt,
                        "step": m["step"],
                        "name": m["name"][:200],
                        "value": m["value"],
                        "time": _ts(m["time"]),
                    }
                    for m in report.metrics
                ],
            )
        self.add_logs(job, report.logs, source="driver")
        # the files a report names, a row each: the item's own keys are the row's columns
        for model, items in (
            (Checkpoint, report.checkpoints),
            (Rollout, report.rollouts),
            (Prediction, report.predictions),
        ):
            self.session.add_all(
                model(job_id=job.id, attempt=attempt, **{**item, "time": _ts(item["time"])}) for item in items
            )
        for e in report.events:
            kind, message = e["kind"][:40], redact(e["message"])
            if (
                kind == FINAL_REPORT_EVENT
            ):  # the driver's last report: names its attempt (final_report_stored)
                message = f"attempt {attempt}: {message} (report seq {report.seq})"
            self._lifecycle.record_event(job, kind, message, at=_ts(e.get("time")))
        if report.rollout_wish is not None:  # an elastic job's driver asks for engines: the pass reads it
            asked = record_wish(job, report.rollout_wish)
            if asked is not None:
                self._lifecycle.record_event(job, WISH_EVENT, asked)
        if report.rollout_followed is not None:  # engines taken back before that grant are stopped
            stopped = release_followed(self.session, job, report.rollout_followed)
            if stopped is not None:
                self._lifecycle.record_event(job, STOPPED_EVENT, stopped)
        self.session.flush()
        if report.phase == Phase.RUNNING and job.status == JobStatus.STARTING:
            self._lifecycle.transition(
                job.id, JobStatus.RUNNING, expected_from=JobStatus.STARTING, reason="driver is up"
            )
        return self._stop_requested(job)

    @staticmethod
    def _stop_requested(job: Job) -> bool:
        return job.status in (JobStatus.CANCELLING, JobStatus.PREEMPTING)

    # The end of a run: nothing acknowledged is lost (docs/reliability.md) ----------------------
    def final_report_stored(self, job: Job) -> bool:
        """Whether the driver of the job's current attempt has had its last report (the one carrying the
        `final_report` event, runtime/reporter.py `close`) stored. Reports are applied strictly in
        sequence, so then every report of the attempt is stored. A job is SUCCEEDED only after this."""
        return bool(
            self.session.scalar(
                sa.select(sa.func.count())
                .select_from(JobEvent)
                .where(
                    JobEvent.job_id == job.id,
                    JobEvent.kind == FINAL_REPORT_EVENT,
                    JobEvent.reason.like(f"attempt {job.attempt}: %"),
                )
            )
        )

    def awaiting_final_report_since(self, job: Job) -> datetime:
        """When the platform first saw this attempt's Ray job end without the final report stored. The
        first call records it (an `awaiting_final_report` event) and says so in the job's status reason;
        the status itself stays (the job is not SUCCEEDED until the report is stored)."""
        marker = f"attempt {job.attempt}: "
        since = self.session.scalar(
            sa.select(JobEvent.time)
            .where(
                JobEvent.job_id == job.id,
                JobEvent.kind == AWAITING_FINAL_REPORT_EVENT,
                JobEvent.reason.like(marker + "%"),
            )
            .order_by(JobEvent.id)
            .limit(1)
        )
        if since is not None:
            return since
        now = utcnow()
        self._lifecycle.record_event(
            job,
            AWAITING_FINAL_REPORT_EVENT,
            marker + f"the driver's Ray job ended before its final report was stored (last stored report "
            f"seq {job.report_seq}); waiting for the driver's spool",
            at=now,
        )
        job.status_reason = WAITING_FOR_FINAL_REPORT
        self.session.flush()
        return now

    def collect_spool(self, job: Job, signing_key: bytes) -> SpoolCollection:
        """Apply what the job's current attempt left in its report spool (runtime/spool.py): the reports
        its driver could not deliver before it ended (the API was down). For the reconciler, once the Ray
        job has ended and while the job is still on the cluster.

        Only lines signed with the key derived from the attempt's token count: nobody but the driver holding
        that token can write one, so this path trusts exactly what `POST …/report` does. Reports go through
        `ingest_report` in sequence order, each checked as the API checks a report (`Report`) and applied in a
        savepoint: one already stored is skipped, a gap, a report the API would refuse or one that fails stops
        the collection (the earlier ones stay applied). The caller deletes a spool
        that is `complete` once its transaction has committed (`SpoolCollection.discard`)."""
        directory = spool_dir(job.output_dir, job.attempt)
        if not directory.is_dir():
            return SpoolCollection(str(directory), found=False)
        key = spool_key(job_token(signing_key, job.id, job.attempt))
        applied = stored = left = 0
        problem: str | None = None
        for item in read_spool(directory, key):
            if problem is not None:
                left += 1
                continue
            if item.payload is None:
                problem = "a line does not verify (not written by this attempt's driver, or damaged)"
                left += 1
                continue
            if item.seq <= job.report_seq:
                stored += 1
                continue
            try:
                with self.session.begin_nested():
                    self.ingest_report(job, Report.model_validate(item.payload))
            except Exception as exc:  # noqa: BLE001 - a report the API would refuse: stop here, say why
                self.session.refresh(job)
                problem = redact(f"report seq {item.seq}: {type(exc).__name__}: {exc}")[:500]
                left += 1
                continue
            applied += 1
        result = SpoolCollection(
            str(directory), found=True, applied=applied, stored=stored, left=left, problem=problem
        )
        if applied or problem:
            self._lifecycle.record_event(job, "spool_collected", result.summary(job.attempt))
        return result

    def reconcile_checkpoints(self, job: Job) -> CheckpointReconciliation:
        """Make the job's checkpoint records match the files: a record whose folder is gone (retention, a
        person, a lost disk) is removed, and a complete `iter_NNNNNNN` checkpoint this job wrote under its
        `save` folder without a record (its registration was lost with a report) is registered. Each change
        is a job event. Run when the job's run ends and before it resumes (`driver_spec`)."""
        missing: list[str] = []
        known: set[str] = set()
        for c in JobOutputs(self.session).checkpoints(job):
            if Path(c.path).is_dir():
                known.add(c.path)
                continue
            missing.append(c.path)
            self.session.delete(c)
            self._lifecycle.record_event(
                job, "checkpoint_missing", f"{c.format} checkpoint of step {c.step} is gone from {c.path}"
            )
        registered: list[int] = []
        save = (job.spec or {}).get("save")
        if save:
            for iteration in list_iterations(save):
                folder = iteration_dir(save, iteration)
                if (
                    str(folder) in known
                    or not is_complete_checkpoint(folder)
                    or folder_owner(folder) != job.id
                ):
                    continue
                stat = folder.stat()
                self.session.add(
                    Checkpoint(
                        job_id=job.id,
                        attempt=job.attempt,
                        step=iteration,
                        path=str(folder),
                        size_bytes=directory_size(folder),
                        format="torch",
                        time=_ts(stat.st_mtime),
                    )
                )
                registered.append(iteration)
                self._lifecycle.record_event(
                    job,
                    "checkpoint_registered",
                    f"torch checkpoint of step {iteration} found on disk without a registration: {folder}",
                )
        self.session.flush()
        return CheckpointReconciliation(registered=registered, missing=missing)
