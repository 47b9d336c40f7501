"""An eval's verdict once its job has ended (`job_ended`, called by `JobLifecycle.transition` in the transaction of
the job's last status change): the job's `eval/*` metrics, each threshold's verdict, the eval passed, failed or
error, and its `eval.completed` webhook message. Thresholds themselves (`Threshold`, `parse_threshold`) live here
too: the API parses them, this module judges them. The eval's creation is scheduler/services/evals.py."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Eval, Job, Metric, utcnow
from scheduler.domain.evals import EvalOutcome, Verdict
from scheduler.domain.jobs import JobStatus
from scheduler.services import webhooks

#: The label an eval's job carries: the eval's id (a job without it is no eval's, and costs no query here).
EVAL_LABEL = "relax.eval"

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}
_THRESHOLD = re.compile(r"^\s*(?P<metric>[^\s<>=!]+)\s*(?P<op>>=|<=|==|>|<)\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    value: float

    def holds(self, actual: float) -> bool:
        return not math.isnan(actual) and OPERATORS[self.op](actual, self.value)

    def text(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def parse_threshold(text: str) -> Threshold | None:
    """`eval/gsm8k >= 0.6` -> Threshold; None when `text` is not `<metric> <op> <number>` (op one of >=, >, <=,
    <, ==; the number finite)."""
    m = _THRESHOLD.match(text)
    if m is None:
        return None
    try:
        value = float(m["value"])
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return Threshold(m["metric"], m["op"], value)


def job_metrics(session: Session, job_id: str) -> dict[str, float]:
    """The job's `eval/*` metrics: each one's value of its newest attempt and step."""
    rows = session.execute(
        sa.select(Metric.name, Metric.value)
        .where(Metric.job_id == job_id, Metric.name.like("eval/%"))
        .order_by(Metric.attempt, Metric.step, Metric.id)
    )
    return {name: value for name, value in rows}


def judge(
    thresholds: list[dict[str, Any]], metrics: dict[str, float]
) -> tuple[list[dict[str, Any]], EvalOutcome]:
    """Each threshold with its `actual` value and `verdict` (pass, fail, or missing when the job did not report
    the metric), and the eval's outcome: passed when every one passes, error when a metric is missing, else
    failed."""
    judged = []
    for t in thresholds:
        threshold = Threshold(t["metric"], t["op"], float(t["value"]))
        actual = metrics.get(threshold.metric)
        if actual is None:
            verdict = Verdict.MISSING
        else:
            verdict = Verdict.PASS if threshold.holds(actual) else Verdict.FAIL
        judged.append({**t, "actual": _json_number(actual), "verdict": str(verdict)})
    verdicts = {t["verdict"] for t in judged}
    if Verdict.MISSING in verdicts:
        return judged, EvalOutcome.ERROR
    return judged, EvalOutcome.FAILED if Verdict.FAIL in verdicts else EvalOutcome.PASSED


def _json_number(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def job_ended(session: Session, job: Job) -> Eval | None:
    """The verdict of the eval `job` ran, if it ran one (its `EVAL_LABEL`) and it is still running: SUCCEEDED
    judges the thresholds on its metrics; FAILED or CANCELLED ends the eval in error. Records `eval.completed`
    for the team's webhooks. Called in the transaction of the job's terminal transition."""
    eval_id = (job.labels or {}).get(EVAL_LABEL)
    if not eval_id:
        return None
    ev = session.get(Eval, eval_id)
    if ev is None or ev.job_id != job.id or ev.outcome != EvalOutcome.RUNNING:
        return None
    metrics = job_metrics(session, job.id)
    ev.metric_values = {k: _json_number(v) for k, v in metrics.items()}
    if job.status == JobStatus.SUCCEEDED:
        ev.thresholds, ev.outcome = judge(list(ev.thresholds), metrics)
        missing = [t["metric"] for t in ev.thresholds if t["verdict"] == Verdict.MISSING]
        failed = [
            Threshold(t["metric"], t["op"], t["value"]).text()
            for t in ev.thresholds
            if t["verdict"] == Verdict.FAIL
        ]
        ev.reason = (
            f"the job reported no {', '.join(missing)}"
            if missing
            else f"{len(failed)} of {len(ev.thresholds)} thresholds failed: {'; '.join(failed)}"
            if failed
            else f"all {len(ev.thresholds)} thresholds passed"
        )
    else:
        ev.thresholds = [{**t, "actual": None, "verdict": str(Verdict.MISSING)} for t in ev.thresholds]
        ev.outcome = EvalOutcome.ERROR
        ev.reason = f"job {job.id} ended {job.status}: {job.status_reason or 'no reason given'}"
    ev.finished_at = utcnow()
    session.flush()
    webhooks.record_eval_completed(session, job, eval_payload(ev))
    return ev


def eval_payload(ev: Eval) -> dict[str, Any]:
    """What an `eval.completed` message says of the eval."""
    return {
        "id": ev.id,
        "name": ev.name,
        "team": ev.team_id,
        "job_id": ev.job_id,
        "outcome": ev.outcome,
        "reason": ev.reason,
        "model": ev.model,
        "model_key": ev.model_key,
        "thresholds": ev.thresholds,
        "metric_values": ev.metric_values or {},
        "finished_at": ev.finished_at.isoformat().replace("+00:00", "Z") if ev.finished_at else None,
    }
