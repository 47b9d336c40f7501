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

from runtime.report_protocol import Grant, RolloutWish
from runtime.reporter import EventKind, HttpReporter, LocalReporter, Phase, ReporterLogHandler, RolloutSplit
from runtime.train.checkpoint import CheckpointFormat, CheckpointRecord


class FakePlatform:
    """Records report bodies; fails the first `fail_first` requests with 503; can ask for a stop."""

    def __init__(self) -> None:
        self.reports: list[dict] = []
        self.headers: list[str] = []
        self.fail_first = 0
        self.stop = False
        self.answer: dict = {}  # more of the answer (an elastic job's grant)
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
                payload = json.dumps({"stop_requested": platform.stop, **platform.answer}).encode()
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


def test_an_elastic_jobs_grant_comes_back_and_the_driver_says_what_it_followed_and_asks_for(platform) -> None:
    fake, url = platform
    reporter = HttpReporter(url, "j", "t", flush_interval=0.05, heartbeat_interval=0.1)
    assert reporter.grant is None and reporter.granted_engines is None  # no answer has carried one yet
    fake.answer = {
        "rollout_engines": [{"node": "n0", "ray_node_id": "ray-0"}, {"node": "n1", "ray_node_id": None}],
        "rollout_grant": 41,
    }
    wait_for(lambda: reporter.grant is not None)
    assert reporter.grant == Grant(("ray-0", None), 41) and reporter.granted_engines == ("ray-0", None)
    reporter.rollout_wish(RolloutWish(step=3, engines=2, share=0.7, threshold=0.6))
    reporter.rollout_followed(41)
    assert reporter.close(timeout=10)
    sent = [(r["rollout_wish"], r["rollout_followed"]) for r in fake.reports if "rollout_followed" in r]
    assert sent == [({"step": 3, "engines": 2, "share": 0.7, "threshold": 0.6}, 41)]  # in one report, once


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


# -- the spool: nothing acknowledged is lost (docs/reliability.md) ------------------------------------------
class SequencedPlatform:
    """The platform's rules for reports (scheduler/services/reports.py::ingest_report) over real HTTP: a report
    is stored when its seq is the next one, a resend of a stored one is acknowledged without storing it
    again, one further ahead gets 422. `refuse` answers 401 to everything (the attempt ended). It can be
    stopped and started again on the same port: an API that goes away and comes back."""

    def __init__(self) -> None:
        self.stored: list[dict] = []
        self.resends = 0
        self.refuse = False
        self.lock = threading.Lock()
        self.port = _free_port()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with platform.lock:
                    expected = len(platform.stored)
                    if platform.refuse:
                        status, answer = 401, {"error": {"code": "job.bad_token"}}
                    elif body["seq"] < expected:
                        platform.resends += 1
                        status, answer = 200, {"stop_requested": False}
                    elif body["seq"] > expected:
                        status, answer = 422, {"error": {"code": "report.seq_gap"}}
                    else:
                        platform.stored.append(body)
                        status, answer = 200, {"stop_requested": False}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def items(self, kind: str) -> list[dict]:
        with self.lock:
            return [item for report in self.stored for item in report[kind]]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sequenced() -> Iterator[SequencedPlatform]:
    platform = SequencedPlatform()
    yield platform
    platform.stop()


def _spool_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("seg-*.jsonl")) if folder.is_dir() else []


def test_reports_made_while_the_api_is_down_arrive_once_and_in_order_when_it_returns(
    sequenced: SequencedPlatform, tmp_path: Path
) -> None:
    spool = tmp_path / "job" / ".relax" / "reports" / "attempt-1"
    reporter = HttpReporter(
        sequenced.url,
        "j",
        "tok",
        attempt=1,
        flush_interval=0.02,
        heartbeat_interval=0.05,
        max_backoff=0.1,
        timeout=1,
    )
    reporter.attach_spool(spool)
    sequenced.start()
    produced = []

    def produce(steps: range) -> None:
        for step in steps:
            values = {"train/loss": 1.0 / (step + 1), "train/lr": 0.1}
            reporter.metrics(step, values)
            produced.extend((step, name, value) for name, value in values.items())
            time.sleep(0.002)

    produce(range(0, 50))
    sequenced.stop()  # the API goes away (SIGKILL of the platform's process) while training goes on
    produce(range(50, 300))
    wait_for(lambda: len(_spool_files(spool)) > 0 and reporter.unsent_reports > 10)
    on_disk = sum(f.stat().st_size for f in _spool_files(spool))
    assert on_disk > 0  # what the platform has not acknowledged is on disk, not only in memory
    sequenced.start()  # it comes back
    produce(range(300, 350))
    assert reporter.close(timeout=20, final="exit 0: finished")
    seqs = [r["seq"] for r in sequenced.stored]
    assert seqs == list(range(len(seqs)))  # in order, no gap
    got = [(m["step"], m["name"], m["value"]) for m in sequenced.items("metrics")]
    assert got == produced  # every point exactly once, in the order produced
    assert reporter.failed_sends > 0
    finals = [e for e in sequenced.items("events") if e["kind"] == "final_report"]
    assert [e["message"] for e in finals] == ["exit 0: finished"]
    assert finals[0] in sequenced.stored[-1]["events"]  # the end marker is in the very last report
    assert not spool.exists() and not (tmp_path / "job" / ".relax").exists()  # all acknowledged: deleted


def test_the_spool_bound_holds_and_the_driver_waits_instead_of_dropping(
    sequenced: SequencedPlatform, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    bound = 16 * 1024
    reporter = HttpReporter(
        sequenced.url,
        "j",
        "tok",
        flush_interval=0.01,
        heartbeat_interval=60,
        max_backoff=0.05,
        timeout=1,
        spool_max_bytes=bound,
        max_pending_items=200,
    )
    reporter.attach_spool(spool)
    produced = 0
    largest = 0
    done = threading.Event()

    def produce() -> None:
        nonlocal produced
        for step in range(3000):
            reporter.metrics(step, {"train/loss": float(step)})
            produced += 1
        done.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    deadline = time.monotonic() + 1.5
    longest_line = 0
    while time.monotonic() < deadline:  # the API is down: the spool fills up to its bound, then stops
        files = _spool_files(spool)
        largest = max(largest, sum(f.stat().st_size for f in files))
        longest_line = max([longest_line] + [len(x) for f in files for x in f.read_bytes().splitlines()])
        time.sleep(0.01)
    assert not done.is_set() and produced < 3000  # the producer waits for room; nothing was dropped
    assert bound <= largest <= bound + longest_line  # the bound, plus the one report that crossed it
    assert longest_line < 25 * 1024  # a report holds what waited: at most max_pending_items items
    sequenced.start()
    assert done.wait(20)
    assert reporter.close(timeout=20)
    assert [m["step"] for m in sequenced.items("metrics")] == list(range(3000))
    assert reporter.blocked_seconds > 0.5
    assert any(
        "waited" in line["message"] and "report spool" in line["message"] for line in sequenced.items("logs")
    )


def test_a_refused_attempt_stops_the_driver_and_leaves_its_reports_on_disk(
    sequenced: SequencedPlatform, tmp_path: Path
) -> None:
    sequenced.refuse = True
    sequenced.start()
    spool = tmp_path / "spool"
    reporter = HttpReporter(sequenced.url, "j", "tok", flush_interval=0.02, heartbeat_interval=60, timeout=1)
    reporter.attach_spool(spool)
    reporter.metrics(0, {"train/loss": 1.0})
    wait_for(lambda: reporter.stop_requested)  # the driver checkpoints and exits between steps
    assert reporter.refused == "HTTP 401 job.bad_token"
    started = time.monotonic()
    assert reporter.close(timeout=10, final="exit 0: stopped") is False
    assert time.monotonic() - started < 2  # no waiting for an answer that will never change
    assert _spool_files(spool)  # kept for the record


def test_spool_lines_are_signed_with_the_attempts_token(tmp_path: Path) -> None:
    from runtime.spool import DiskSpool, read_spool, spool_key

    key = spool_key("rjt_1_token")
    spool = DiskSpool(tmp_path, key)
    for seq in range(3):
        spool.append({"attempt": 1, "seq": seq, "metrics": [{"step": seq, "name": "x", "value": 1.0}]})
    spool.close()
    assert [r.seq for r in read_spool(tmp_path, key)] == [0, 1, 2]
    assert [r.payload for r in read_spool(tmp_path, spool_key("rjt_1_other"))] == [
        None
    ]  # another key: nothing
    segment = next(tmp_path.glob("seg-*.jsonl"))
    lines = segment.read_text().splitlines(keepends=True)
    forged = lines[1].replace('"value":1.0', '"value":9.0')
    segment.write_text(lines[0] + forged + lines[2] + lines[2][: len(lines[2]) // 2])
    found = list(read_spool(tmp_path, key))
    assert found[0].seq == 0 and found[1].payload is None and len(found) == 2  # a changed line ends it
