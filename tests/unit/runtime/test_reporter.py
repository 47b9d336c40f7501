"""Reporters against a real local HTTP server (a socket, not a mock)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runtime.reporter import EventKind, HttpReporter, LocalReporter, Phase, ReporterLogHandler, RolloutSplit
from runtime.train.checkpoint import CheckpointFormat, CheckpointRecord


class FakePlatform:
    """Records report bodies; fails the first `fail_first` requests with 503; can ask for a stop."""

    def __init__(self) -> None:
        self.reports: list[dict] = []
        self.headers: list[str] = []
        self.fail_first = 0
        self.stop = False
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with platform.lock:
                    platform.headers.append(self.headers.get("Authorization", ""))
                    if platform.fail_first > 0:
                        platform.fail_first -= 1
                        self.send_response(503)
                        self.end_headers()
                        return
                    platform.reports.append({"path": self.path, **body})
                payload = json.dumps({"stop_requested": platform.stop}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        return Handler

    def items(self, kind: str) -> list[dict]:
        with self.lock:
            return [item for report in self.reports for item in report[kind]]


@pytest.fixture
def platform() -> Iterator[tuple[FakePlatform, str]]:
    fake = FakePlatform()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_batches_items_into_few_reports_with_auth(platform) -> None:
    fake, url = platform
    reporter = HttpReporter(url, "job_1", "tok123", attempt=2, flush_interval=0.2, heartbeat_interval=60)
    reporter.set_phase(Phase.RUNNING)
    for step in range(50):
        reporter.metrics(step, {"rollout/reward": step / 50, "train/loss": 1.0})
        reporter.set_progress(step + 1, 50)
    reporter.checkpoint(
        CheckpointRecord(
            step=9, path="/ck/iter_0000009", size_bytes=123, format=CheckpointFormat.TORCH, time=1.0
        )
    )
    reporter.rollout(3, RolloutSplit.TRAIN, "/ck/rollout_result/train/3.jsonl", 16)
    reporter.event(EventKind.MODEL_LOADED, "ok")
    assert reporter.close(timeout=10)
    assert all(h == "Bearer tok123" for h in fake.headers)
    assert {r["path"] for r in fake.reports} == {"/v1/internal/jobs/job_1/report"}
    seqs = [r["seq"] for r in fake.reports]
    assert seqs == list(range(len(seqs))) and len(seqs) <= 5
    assert all(r["attempt"] == 2 for r in fake.reports)
    assert [r["phase"] for r in fake.reports].count("running") == 1
    assert len(fake.items("metrics")) == 100
    assert fake.reports[-1]["progress"] == {"step": 50, "total_steps": 50}
    assert fake.items("checkpoints") == [
        {"step": 9, "path": "/ck/iter_0000009", "size_bytes": 123, "format": "torch", "time": 1.0}
    ]
    assert fake.items("rollouts")[0]["split"] == "train"
    assert fake.items("events")[0]["kind"] == "model_loaded"


def test_retries_keep_the_batch_and_its_seq(platform) -> None:
    fake, url = platform
    fake.fail_first = 3
    reporter = HttpReporter(url, "j", "t", flush_interval=0.05, heartbeat_interval=60, max_backoff=0.2)
    reporter.metrics(0, {"train/loss": 1.5})
    assert reporter.flush(timeout=10)
    reporter.metrics(1, {"train/loss": 1.0})
    assert reporter.close(timeout=10)
    assert reporter.failed_sends == 3
    assert [m["value"] for m in fake.items("metrics")] == [1.5, 1.0]  # nothing lost, nothing doubled
    seqs = [r["seq"] for r in fake.reports]
    assert seqs == sorted(set(seqs))


def test_unreachable_api_never_raises_and_close_gives_up() -> None:
    reporter = HttpReporter("http://127.0.0.1:9", "j", "t", flush_interval=0.05, max_backoff=0.1, timeout=0.5)
    for step in range(10):
        reporter.metrics(step, {"train/loss": 1.0})
        reporter.log("INFO", "hello")
    started = time.monotonic()
    assert reporter.close(timeout=1.0) is False
    assert time.monotonic() - started < 10
    assert reporter.failed_sends >= 1


def test_stop_request_comes_back_through_heartbeats(platform) -> None:
    fake, url = platform
    reporter = HttpReporter(url, "j", "t", flush_interval=0.05, heartbeat_interval=0.1)
    assert not reporter.stop_requested
    fake.stop = True
    wait_for(lambda: reporter.stop_requested)
    reporter.close()


def test_log_handler_forwards_records_with_tracebacks(platform) -> None:
    fake, url = platform
    reporter = HttpReporter(url, "j", "t", flush_interval=0.05, heartbeat_interval=60)
    logger = logging.getLogger("runtime.test_reporter_forwarding")
    logger.propagate = False
    logger.addHandler(ReporterLogHandler(reporter))
    logger.setLevel(logging.INFO)
    logger.info("stage summary %d", 3)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    reporter.close()
    logs = fake.items("logs")
    assert (
        logs[0]["message"] == "stage summary 3"
        and logs[0]["level"] == "INFO"
        and logs[0]["source"] == "driver"
    )
    assert "ValueError: boom" in logs[1]["message"] and logs[1]["level"] == "ERROR"


def test_local_reporter_prints_and_writes_jsonl(tmp_path: Path) -> None:
    import io

    stream = io.StringIO()
    reporter = LocalReporter(tmp_path, stream=stream, flush_interval=0.05)
    reporter.metrics(0, {"rollout/reward": 0.25})
    reporter.checkpoint(
        CheckpointRecord(step=0, path="/x", size_bytes=1, format=CheckpointFormat.HF, time=0.0)
    )
    reporter.close()
    assert "[metrics] step 0: rollout/reward=0.25" in stream.getvalue()
    assert "[checkpoint] step 0 hf 1 B /x" in stream.getvalue()
    metric = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert metric["name"] == "rollout/reward" and metric["value"] == 0.25 and metric["step"] == 0
    assert (tmp_path / "reports.jsonl").exists()
    (tmp_path / "STOP").touch()  # left over from that run: a new run must not see it
    again = LocalReporter(tmp_path, stream=stream, flush_interval=0.05)
    assert not (tmp_path / "STOP").exists()
    (tmp_path / "STOP").touch()
    wait_for(lambda: again.stop_requested)
    again.close()
