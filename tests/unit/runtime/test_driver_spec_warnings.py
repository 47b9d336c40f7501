"""The driver logs the warnings of jobspec's rules once at start, each with its code: a job run from a spec file
says, as the pipeline used to, what the platform says at submission."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import driver
from runtime.spec import load_spec_with_warnings, read_spec_file

ROOT = Path(__file__).resolve().parents[3]
KL_WARNING = "rule.kl_loss_coef_without_use_kl_loss"


@pytest.fixture
def runtime_logger() -> Iterator[None]:
    """`driver.main` configures the `runtime` logger for the job; put it back afterwards."""
    logger = logging.getLogger("runtime")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    yield
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    for handler in saved[2]:
        logger.addHandler(handler)


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _spec(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """grpo-arith.yaml with its platform references turned into local paths."""
    raw, _ = read_spec_file(ROOT / "examples" / "grpo-arith.yaml")
    raw = {k: (str(tmp_path) if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    raw["eval-prompt-data"] = ["arith", str(tmp_path)]
    return {**raw, **changes}


def _logged(report_dir: Path) -> list[dict[str, Any]]:
    """Every log record the driver reported (LocalReporter's reports.jsonl)."""
    lines = []
    for line in (report_dir / "reports.jsonl").read_text(encoding="utf-8").splitlines():
        lines += json.loads(line).get("logs") or []
    return lines


def test_a_spec_files_warnings_are_logged_once_with_their_codes(tmp_path: Path, runtime_logger: None) -> None:
    # use-kl-loss with coefficient 0 (a warning), and a parameter the torch backend refuses, so that the
    # driver stops right after reading the spec, before it starts Ray
    spec = _spec(tmp_path, **{"kl-loss-coef": 0.0, "reward-num-workers": 4})
    _, warnings = load_spec_with_warnings(spec)
    assert [w.code for w in warnings] == [KL_WARNING]
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"name": "warned", "spec": spec}), encoding="utf-8")
    report = tmp_path / "report"
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    logging.getLogger("runtime.driver").addHandler(handler)  # below the `runtime` logger the driver sets up
    try:
        assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 1
    finally:
        logging.getLogger("runtime.driver").removeHandler(handler)

    (record,) = [r for r in records if KL_WARNING in r.getMessage()]
    assert record.name == "runtime.driver" and record.levelno == logging.WARNING
    assert "--kl-loss-coef 0" in record.getMessage()  # the message and its hint, not only the code
    assert "set --kl-loss-coef > 0" in record.getMessage()
    # and it reaches the job's log (the reporter), once
    reported = [r for r in _logged(report) if KL_WARNING in r.get("message", "")]
    assert len(reported) == 1 and reported[0]["level"] == "WARNING", reported


def test_a_spec_without_warnings_logs_none(tmp_path: Path, runtime_logger: None) -> None:
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"spec": _spec(tmp_path, **{"reward-num-workers": 4})}), encoding="utf-8")
    report = tmp_path / "report"
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 1
    assert not [r for r in _logged(report) if "spec warning" in r.get("message", "")]


def test_a_normalized_spec_is_not_checked_again(tmp_path: Path) -> None:
    """A platform job's spec was normalized at submission, where its warnings were given."""
    spec, warnings = load_spec_with_warnings(_spec(tmp_path, **{"kl-loss-coef": 0.0}), normalized=True)
    assert warnings == [] and spec.use_kl_loss and spec.kl_loss_coef == 0.0
