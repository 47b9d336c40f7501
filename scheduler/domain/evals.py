"""CI evals: how an eval ends and each threshold's verdict (scheduler/services/eval_verdicts.py decides them)."""

from __future__ import annotations

from enum import StrEnum

#: The built-in priority class of eval jobs (migration 0012; docs/adr/0011-eval-priority-class.md): above the
#: default training classes, preemptible, for jobs that `POST /v1/evals` submits only. Its rank counts within
#: the team's quota: beyond it, an eval job ranks at its team's highest training class.
EVAL_PRIORITY_CLASS = "eval"
EVAL_PRIORITY_VALUE = 50


class EvalOutcome(StrEnum):
    RUNNING = "running"  # its job has not ended
    PASSED = "passed"  # every threshold holds
    FAILED = "failed"  # a threshold does not hold
    ERROR = "error"  # its job did not succeed, or reported no value for a threshold's metric


class Verdict(StrEnum):
    """One threshold's."""

    PENDING = "pending"  # the eval runs
    PASS = "pass"
    FAIL = "fail"
    MISSING = "missing"  # the job ended without the metric
