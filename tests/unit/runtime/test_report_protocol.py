"""The report protocol is declared once (runtime/report_protocol.py): what the real reporter writes is a `Report`
as the platform validates it, item for item, and the API's report route takes that declaration itself."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

from runtime.report_protocol import REPORT_LISTS, Report, RolloutWish
from runtime.reporter import EventKind, LocalReporter, Phase, RolloutSplit
from runtime.train.checkpoint import CheckpointFormat, CheckpointRecord


def _reports_of_a_run(out: Path) -> list[dict]:
    reporter = LocalReporter(out, stream=io.StringIO(), flush_interval=0.01, heartbeat_interval=60.0)
    reporter.set_phase(Phase.RUNNING)
    reporter.set_progress(1, 2)
    reporter.metrics(1, {"train/loss": 0.5, "train/lr": 1e-3})
    reporter.log("WARNING", "a line", source="rollout", when=12.5)
    reporter.checkpoint(CheckpointRecord(1, "/x/iter_0000001", 123, CheckpointFormat.TORCH, 13.0))
    reporter.rollout(7, RolloutSplit.EVAL, "/x/rollouts/7.jsonl", 64)
    reporter.prediction(1, "/x/predict/predictions_step_1.jsonl", 32)
    reporter.event(EventKind.CHECKPOINT_SAVED, "iter 1")
    reporter.rollout_wish(RolloutWish(step=1, engines=3, share=0.72, threshold=0.6))
    reporter.rollout_followed(12)
    assert reporter.close(timeout=10.0, final="exit 0: finished")
    return [json.loads(line) for line in (out / "reports.jsonl").read_text().splitlines()]


def test_the_reporters_reports_are_reports_and_validation_changes_no_value_it_sent(tmp_path: Path) -> None:
    sent = _reports_of_a_run(tmp_path)
    kinds = {kind for body in sent for kind in REPORT_LISTS if body[kind]}
    assert kinds == set(REPORT_LISTS)  # every kind of item went out, so each is checked below
    wishes = [(body["rollout_wish"], body["rollout_followed"]) for body in sent if "rollout_wish" in body]
    assert wishes == [({"step": 1, "engines": 3, "share": 0.72, "threshold": 0.6}, 12)]  # once, in one report
    elastic = {"rollout_wish", "rollout_followed"}  # an elastic job's, in the reports that have them
    for body in sent:
        assert set(body) - elastic == {"attempt", "seq", "phase", "progress", *REPORT_LISTS}
        report = Report.model_validate(body)
        assert (report.rollout_wish, report.rollout_followed) == (
            body.get("rollout_wish"),
            body.get("rollout_followed"),
        )
        for kind in REPORT_LISTS:
            for item, checked in zip(body[kind], getattr(report, kind), strict=True):
                assert {k: checked[k] for k in item} == item, kind  # nothing sent is dropped or altered
                assert set(checked) - set(item) <= {"time"}, (
                    kind
                )  # only a rollout's time is left to the platform
    events = [e["kind"] for body in sent for e in body["events"]]
    assert events[-1] == EventKind.FINAL_REPORT


def test_the_lists_are_the_reports_list_fields() -> None:
    hints = get_type_hints(Report, include_extras=True)
    lists = tuple(name for name in Report.model_fields if get_origin(hints[name]) is list)
    assert REPORT_LISTS == lists == ("metrics", "logs", "checkpoints", "rollouts", "predictions", "events")
    for name in REPORT_LISTS:
        (item,) = get_args(hints[name])
        assert item.__module__ == "runtime.report_protocol" and item.__name__.endswith("Item")


def test_the_api_takes_the_protocols_report(relax_home: Path) -> None:
    """The report route's body is `Report` itself, and OpenAPI lists each item with the keys it requires."""
    from api.app import create_app

    doc = create_app().openapi()
    body = doc["paths"]["/v1/internal/jobs/{job_id}/report"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Report"}
    schemas = doc["components"]["schemas"]
    hints = get_type_hints(Report, include_extras=True)
    for kind in REPORT_LISTS:
        (item,) = get_args(hints[kind])
        assert schemas["Report"]["properties"][kind]["items"] == {
            "$ref": f"#/components/schemas/{item.__name__}"
        }
        assert set(schemas[item.__name__].get("required", [])) == item.__required_keys__
