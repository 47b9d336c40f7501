"""`relaxctl eval`'s own pieces: Relax flags after `--` and the JUnit XML of an ended eval (the command against
the real platform is tests/e2e/test_evals.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import typer

from client.evals import relax_flags, write_junit


def test_relax_flags_after_the_double_dash() -> None:
    pairs, config, samples, passrate, spec = relax_flags(
        ["--eval-prompt-data", "gsm8k", "a.jsonl", "math", "b.jsonl", "--n-samples-per-eval-prompt", "8",
         "--log-passrate", "--rm-type", "math", "--eval-temperature=0.6", "--rollout-stop", "</s>", "\n\n",
         "--apply-chat-template"]
    )  # fmt: skip
    assert pairs == ["gsm8k", "a.jsonl", "math", "b.jsonl"] and samples == 8 and passrate is True
    assert config is None
    assert spec == {"rm-type": "math", "eval-temperature": 0.6, "rollout-stop": ["</s>", "\n\n"],
                    "apply-chat-template": True}  # fmt: skip
    assert relax_flags(["--eval-config", "artifacts://e.yaml"])[1] == "artifacts://e.yaml"
    with pytest.raises(typer.Exit):
        relax_flags(["gsm8k"])  # a value before any flag


def _eval(outcome: str, thresholds: list[dict], **extra: object) -> dict:
    return {
        "id": "ev_1", "name": "ci-1", "job_id": "job_1", "model_key": "job:job_0@5", "outcome": outcome,
        "reason": extra.get("reason"), "job_status": extra.get("job_status", "SUCCEEDED"),
        "created_at": "2026-12-06T03:00:00+00:00", "finished_at": "2026-12-06T03:00:42.5+00:00",
        "thresholds": thresholds,
    }  # fmt: skip


def test_junit_has_one_testcase_per_threshold(tmp_path: Path) -> None:
    out = tmp_path / "reports" / "eval.xml"
    write_junit(
        _eval("failed", [
            {"metric": "eval/gsm8k", "op": ">=", "value": 0.6, "actual": 0.55, "verdict": "fail"},
            {"metric": "eval/gsm8k-pass@4", "op": ">", "value": 0.5, "actual": 0.9, "verdict": "pass"},
            {"metric": "eval/math", "op": "<=", "value": 1.0, "actual": None, "verdict": "missing"},
        ]),
        out,
    )  # fmt: skip
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    assert suite.get("time") == "42.500"
    cases = list(suite.iter("testcase"))
    assert [c.get("name") for c in cases] == [
        "eval/gsm8k >= 0.6",
        "eval/gsm8k-pass@4 > 0.5",
        "eval/math <= 1",
    ]
    assert cases[0].find("failure").get("message") == "eval/gsm8k = 0.55, needs >= 0.6"  # type: ignore[union-attr]
    assert cases[1].find("failure") is None and cases[1].find("error") is None
    assert "not reported" in cases[2].find("error").get("message")  # type: ignore[union-attr]
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["eval.job_id"] == "job_1" and props["eval.model_key"] == "job:job_0@5"


def test_junit_of_a_job_that_failed_names_why(tmp_path: Path) -> None:
    out = tmp_path / "eval.xml"
    reason = "job job_1 ended CANCELLED: cancelled by user"
    write_junit(
        _eval("error", [{"metric": "eval/x", "op": ">=", "value": 0.1, "actual": None, "verdict": "missing"}],
              reason=reason, job_status="CANCELLED"),
        out,
    )  # fmt: skip
    error = ET.parse(out).getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("message") == reason
