"""The platform's log lines (scheduler/logs.py): JSON or text by one switch, with the request, job and team they
concern, also for lines logged in another thread of the same request."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import logging.config
import threading
from collections.abc import Iterator

import pytest

from scheduler.logs import (
    LOG_FORMAT_ENV,
    annotate,
    chosen_format,
    configure_logging,
    log_context,
    make_handler,
    uvicorn_log_config,
)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    named = {
        n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate, logging.getLogger(n).level)
        for n in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery")
    }
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for n, (handlers, propagate, level) in named.items():
        logging.getLogger(n).handlers[:] = handlers
        logging.getLogger(n).propagate = propagate
        logging.getLogger(n).setLevel(level)
    logging.captureWarnings(False)


def _logger(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch, fmt: str) -> logging.Logger:
    monkeypatch.setenv(LOG_FORMAT_ENV, fmt)
    logger = logging.getLogger(f"relax.test.{fmt}")
    logger.handlers[:] = [make_handler("api", stream)]
    logger.propagate, logger.level = False, logging.INFO
    return logger


def test_a_json_line_names_the_request_the_job_and_the_team_added_from_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    log = _logger(out, monkeypatch, "json")
    with log_context(request_id="r1", job_id="job_1"):
        # the thread pool runs a request's sync work in a copy of its context: what it adds is seen after
        worker = threading.Thread(
            target=contextvars.copy_context().run, args=(annotate,), kwargs={"team": "t1"}
        )
        worker.start()
        worker.join()
        log.info("moved %s", "on")
        annotate(job_id=None)
        log.warning("later")
    log.info("outside")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["message"] == "moved on" and lines[0]["level"] == "INFO" and lines[0]["part"] == "api"
    assert (lines[0]["request_id"], lines[0]["job_id"], lines[0]["team"]) == ("r1", "job_1", "t1")
    assert "job_id" not in lines[1] and lines[1]["team"] == "t1"
    assert not {"request_id", "job_id", "team"} & set(lines[2])
    assert lines[3]["exc"].startswith("Traceback") and "ValueError: boom" in lines[3]["exc"]
    assert lines[0]["time"].endswith("+00:00") and isinstance(lines[0]["pid"], int)


def test_extra_fields_win_over_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    log = _logger(out, monkeypatch, "json")
    with log_context(request_id="r2", job_id="job_a"):
        log.info("x", extra={"job_id": "job_b", "team": "t9"})
    line = json.loads(out.getvalue())
    assert (line["request_id"], line["job_id"], line["team"]) == ("r2", "job_b", "t9")


def test_text_is_for_people(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    log = _logger(out, monkeypatch, "text")
    with log_context(request_id="r3", team="t2"):
        log.info("hello")
    log.info("bare")
    first, second = out.getvalue().splitlines()
    assert first.endswith("INFO relax.test.text [req=r3 team=t2]: hello")
    assert second.endswith("INFO relax.test.text: bare")


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOG_FORMAT_ENV, raising=False)
    assert chosen_format(_Tty()) == "text" and chosen_format(io.StringIO()) == "json"  # auto
    monkeypatch.setenv(LOG_FORMAT_ENV, "JSON")
    assert chosen_format(_Tty()) == "json"
    monkeypatch.setenv(LOG_FORMAT_ENV, "yaml")
    with pytest.raises(
        ValueError, match="RELAX_LOG_FORMAT='yaml' is not a log format: use one of auto, json, text"
    ):
        chosen_format()


def test_uvicorns_and_the_roots_records_go_through_one_handler(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    logging.config.dictConfig(json.loads(json.dumps(uvicorn_log_config("api"))))  # as uvicorn reads the file
    root = logging.getLogger()
    assert len(root.handlers) == 1
    out = io.StringIO()
    root.handlers[0].setStream(out)  # type: ignore[attr-defined]
    for name in (
        "uvicorn.access",
        "celery",
    ):  # uvicorn sets their levels itself; another test may have left one
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/x", "1.1", 200
    )
    line = json.loads(out.getvalue())
    assert line["logger"] == "uvicorn.access" and line["message"] == '127.0.0.1:1 - "GET /x HTTP/1.1" 200'
    assert configure_logging("worker", stream=out) == "json"
    logging.getLogger("celery").warning("w")
    assert json.loads(out.getvalue().splitlines()[-1])["part"] == "worker"
