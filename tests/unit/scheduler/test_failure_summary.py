"""The one-line reason of a failed driver, taken from Ray's message and the driver's log."""

from scheduler.domain.reconcile import failure_summary


def test_last_exception_line_wins() -> None:
    tail = ["step 3", "Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'lr'", ""]
    msg = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n..."
    assert failure_summary(msg, tail) == "Job entrypoint command failed with exit code 1: KeyError: 'lr'"


def test_without_an_exception_the_last_line_is_used() -> None:
    assert failure_summary(None, ["loading", "Killed", "  "]) == "the driver failed: Killed"
    assert failure_summary("Job was stopped", []) == "Job was stopped"
