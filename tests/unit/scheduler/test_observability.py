"""The metrics' pieces without a database: preemption reasons as few labels, event tallies, the request
latency middleware's labels and the merge of several processes' files (scheduler/observability.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from api.app import RequestMetrics
from scheduler import observability as obs
from scheduler.policy.policy import _preempt_reason

REPO = Path(__file__).resolve().parents[3]


def test_preemption_reasons_are_a_few_labels() -> None:
    job = SimpleNamespace(id="job_a", priority=100, queue="math", waiting_since=0.0)
    victim = SimpleNamespace(id="job_b", priority=0, queue="vision")
    assert obs.preempt_reason(_preempt_reason("class", job, victim, 0.0)) == "priority"  # type: ignore[arg-type]
    assert obs.preempt_reason(_preempt_reason("reclaim", job, victim, 0.0)) == "reclaim"  # type: ignore[arg-type]
    assert obs.preempt_reason("node n1 of pool h200 is down") == "node_down"
    assert obs.preempt_reason("node n0 is down or left pool h200") == "node_down"
    assert obs.preempt_reason("node n1 of pool h200 is being drained") == "drain"
    assert obs.preempt_reason("job_x (3.0 GPU-h run so far, waiting 1.0 h) goes before it") == "fair_share"
    assert obs.preempt_reason(None) == "other" and obs.preempt_reason("by hand") == "other"


def _row(to: str, src: str | None = None, reason: str | None = None, failure: str | None = None):  # type: ignore[no-untyped-def]
    return SimpleNamespace(to_status=to, from_status=src, reason=reason, pool="p", failure_reason=failure)


def test_events_are_tallied_as_admissions_preemptions_and_outcomes() -> None:
    into: dict[str, Counter] = {"admit": Counter(), "preempt": Counter(), "end": Counter()}
    for r in (
        _row("ADMITTED", "QUEUED"),
        _row("PREEMPTING", "RUNNING", "queue math reclaims GPUs lent to queue vision, for job_a"),
        _row("QUEUED", "ADMITTED", "node n1 of pool p is down"),  # admitted, sent back before launch
        _row("QUEUED", "ADMITTED", "the launch was lost; admitted again"),  # not a preemption
        _row("QUEUED", "PREEMPTING", "preempted; waiting to resume"),  # the preemption's end, counted once
        _row("FAILED", "RUNNING", "exit 1", "user_code"),
        _row("SUCCEEDED", "RUNNING"),
    ):
        obs._count(into, r)  # type: ignore[arg-type]
    assert into["admit"] == Counter({("p",): 1})
    assert into["preempt"] == Counter({("p", "reclaim"): 1, ("p", "node_down"): 1})
    assert into["end"] == Counter({("p", "FAILED", "user_code"): 1, ("p", "SUCCEEDED", ""): 1})


def test_latency_is_labelled_by_route_template() -> None:
    app = FastAPI()

    @app.get("/v1/things/{thing_id}")
    def thing(thing_id: str) -> dict[str, str]:
        return {"id": thing_id}

    wrapped = RequestMetrics(app)

    async def call(path: str, method: str = "GET") -> int:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [],
            "scheme": "http",
            "server": ("test", 80),
            "root_path": "",
        }
        await wrapped(scope, receive, send)
        return sent[0]["status"]

    def count(route: str, status: str) -> float:
        labels = {"method": "GET", "route": route, "status": status}
        return obs.PROCESS.get_sample_value("relax_http_request_duration_seconds_count", labels) or 0.0

    before = count("/v1/things/{thing_id}", "200")
    assert asyncio.run(call("/v1/things/abc123")) == 200
    assert asyncio.run(call("/nowhere/xyz")) == 404
    assert asyncio.run(call("/v1/things/abc123", "BREW")) == 405
    assert (
        obs.PROCESS.get_sample_value(
            "relax_http_request_duration_seconds_count",
            {"method": "other", "route": "/v1/things/{thing_id}", "status": "405"},
        )
        or 0
    ) >= 1
    assert count("/v1/things/{thing_id}", "200") == before + 1
    assert count("unmatched", "404") >= 1
    labels = {
        tuple(sorted(s.labels.items()))
        for f in text_string_to_metric_families(obs.process_metrics().decode())
        for s in f.samples
    }
    assert not any("abc123" in v or "xyz" in v for ls in labels for _, v in ls)


_OBSERVE = "from scheduler import observability as o; o.observe_pass(0.02); o.count_report(5)"


def test_merged_files_of_several_parts(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The scheduler part and a second one, each in its own folder: one text has both's values."""
    for part in ("scheduler", "worker-h200"):
        obs.clean_dir(tmp_path / part)
        env = os.environ | {obs.MULTIPROC_ENV: str(tmp_path / part), "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-c", _OBSERVE], env=env, cwd=REPO, check=True, timeout=120)
    monkeypatch.setenv(obs.METRICS_DIR_ENV, str(tmp_path))
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(obs.process_metrics().decode())
        for s in f.samples
        if not s.labels or s.name.endswith("_count")
    }
    assert samples["relax_scheduling_pass_duration_seconds_count"] == 2
    assert samples["relax_reports_ingested_total"] == 2
    assert samples["relax_report_metric_points_total"] == 10
    obs.clean_dir(tmp_path / "scheduler")  # a part's start empties its own folder only
    assert not list((tmp_path / "scheduler").glob("*.db")) and list((tmp_path / "worker-h200").glob("*.db"))
