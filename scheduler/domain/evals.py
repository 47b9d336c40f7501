"""CI evals: how an eval ends and each threshold's verdict (scheduler/services/eval_verdicts.py decides them)."""

from __future__ import annotations

from enum import StrEnum


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
