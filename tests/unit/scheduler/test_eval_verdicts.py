"""Evals' thresholds and verdicts, and the metrics the platform says an eval produces against the names the
runtime gives them (runtime.eval.eval_metrics): a threshold is refused on exactly what the runtime never reports."""

from __future__ import annotations

import pytest

from runtime.eval import eval_metrics
from runtime.types import Sample, SampleStatus
from scheduler.services.eval_verdicts import Threshold, judge, parse_threshold
from scheduler.services.evals import expected_metrics


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("eval/gsm8k >= 0.6", Threshold("eval/gsm8k", ">=", 0.6)),
        ("eval/gsm8k-pass@4>0.5", Threshold("eval/gsm8k-pass@4", ">", 0.5)),
        ("  eval/x/response_len <= 12  ", Threshold("eval/x/response_len", "<=", 12.0)),
        ("eval/a < -1e-3", Threshold("eval/a", "<", -0.001)),
        ("eval/a == 1", Threshold("eval/a", "==", 1.0)),
        ("eval/a => 1", None),
        ("eval/a != 1", None),
        ("eval/a >= nan", None),
        ("eval/a >= inf", None),
        ("eval/a >= ", None),
        (">= 1", None),
        ("eval/a >= 1 2", None),
    ],
)
def test_thresholds_parse(text: str, parsed: Threshold | None) -> None:
    assert parse_threshold(text) == parsed


def test_verdicts() -> None:
    thresholds = [
        {"metric": "eval/a", "op": ">=", "value": 0.5},
        {"metric": "eval/b", "op": "<", "value": 0.1},
    ]
    judged, status = judge(thresholds, {"eval/a": 0.5, "eval/b": 0.05})
    assert status == "passed" and [t["verdict"] for t in judged] == ["pass", "pass"]
    judged, status = judge(thresholds, {"eval/a": 0.49, "eval/b": 0.05})
    assert status == "failed" and judged[0] == {**thresholds[0], "actual": 0.49, "verdict": "fail"}
    judged, status = judge(thresholds, {"eval/a": 0.9})
    assert status == "error" and judged[1]["verdict"] == "missing"
    judged, status = judge(thresholds, {"eval/a": float("nan"), "eval/b": 0.0})
    assert status == "failed" and judged[0]["actual"] is None  # NaN holds no threshold (and is no JSON)


@pytest.mark.parametrize(("n", "passrate"), [(1, False), (1, True), (4, False), (4, True), (6, True)])
def test_expected_metrics_are_what_the_runtime_reports(n: int, passrate: bool) -> None:
    samples = [
        Sample(
            index=i,
            group_index=i // n,
            prompt="p",
            response_length=3,
            reward=float(i % 2),
            status=SampleStatus.COMPLETED,
        )
        for i in range(2 * n)
    ]
    reported = set(eval_metrics("gsm8k", samples, log_passrate=passrate))
    assert set(expected_metrics([{"name": "gsm8k", "n_samples": n}], log_passrate=passrate)) == reported
