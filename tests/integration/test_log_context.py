"""The API's log lines name the request, the job and the caller's team (scheduler/logs.py), on SQLite and
PostgreSQL: a submission's line and a cancellation's state change, each logged once its unit of work committed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from scheduler.logs import LOG_FORMAT_ENV, make_handler
from tests.factories import grpo_spec


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    out = io.StringIO()
    handler = make_handler("api", out)
    logger = logging.getLogger("relax.jobs")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_submission_and_cancellation_lines_name_request_job_and_team(api, lines: io.StringIO) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    r = client.post("/v1/jobs", json={"spec": grpo_spec()}, headers={"X-Request-ID": "req-submit-1"})
    assert r.status_code == 201, r.text
    job, team = r.json()["id"], r.json()["team_id"]
    r = client.post(f"/v1/jobs/{job}/cancel", headers={"X-Request-ID": "req-cancel-1"})
    assert r.status_code == 202, r.text
    got = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert [(g["message"], g["request_id"], g["job_id"], g["team"]) for g in got] == [
        ("submitted to queue default (pool local): QUEUED", "req-submit-1", job, team),
        ("QUEUED -> CANCELLED: cancelled by user", "req-cancel-1", job, team),
    ]
