"""`relaxctl jobs logs -f` and `relaxctl metrics -f` follow the job's stream to its end, each line once; the
stream's reader resumes a dropped connection after the last id it received."""

from __future__ import annotations

import threading
import time

import httpx

from client.sdk import RelaxClient
from client.watch import follow
from tests.unit.client.test_cli_output import Api, api, run  # noqa: F401 - `api` is the fixture

__all__ = ["api"]


def _driver(api: Api, job: str, steps: int) -> None:  # noqa: F811
    """A driver's reports while relaxctl follows: a log line and a step's metrics a report, then the end."""
    h = api.start(job)
    for i in range(steps):
        api.report(job, h, logs=[{"time": time.time(), "message": f"line {i}"}])
        api.step(job, h, i, time.time())
        time.sleep(0.3)
    api.finish(job)


def test_logs_and_metrics_follow_a_running_job_to_its_end(api: Api) -> None:  # noqa: F811
    job = api.submit("followed")
    thread = threading.Thread(target=_driver, args=(api, job, 3), daemon=True)
    thread.start()
    logs = run("jobs", "logs", job, "-f")
    thread.join(30)
    assert [line.split()[-2:] for line in logs.splitlines() if "line " in line] == [
        ["line", "0"],
        ["line", "1"],
        ["line", "2"],
    ]
    # the job has ended: -f prints everything there is, each once, and returns
    points = run("metrics", job, "-f", "-n", "train/loss")
    assert [line.split()[2:4] for line in points.splitlines()] == [
        ["1", "train/loss"],
        ["2", "train/loss"],
        ["3", "train/loss"],
    ], points
    everything = run("metrics", job, "--follow", "--json")
    assert len(everything.splitlines()) == 3 * 6  # five metrics of each step and its evaluation


def test_follow_resumes_after_the_last_id_received() -> None:
    """A connection that drops mid-stream is reopened with Last-Event-ID: the last id received."""
    asked: list[str | None] = []
    bodies = [
        b'id: e1.m0.l0.c0.r0.p0.s7\nevent: status\ndata: {"status": "RUNNING"}\n\n'
        b'id: e1.m1.l0.c0.r0.p0.s7\nevent: metric\ndata: {"id": 1}\n\n'
        b'id: e1.m2.l0.c0.r0.p0.s7\nevent: metric\ndata: {"id": 2}\n\nid: e1.m3',  # cut mid-message
        b'id: e1.m3.l0.c0.r0.p0.s7\nevent: metric\ndata: {"id": 3}\n\nevent: end\ndata: {}\n\n',
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("last-event-id"))
        return httpx.Response(
            200, content=bodies[len(asked) - 1], headers={"content-type": "text/event-stream"}
        )

    client = RelaxClient("http://relax.test", "k")
    client._http = httpx.Client(base_url="http://relax.test", transport=httpx.MockTransport(handler))
    got = list(follow(client, "job-1"))
    assert asked == [None, "e1.m2.l0.c0.r0.p0.s7"]
    assert [(k, d.get("id")) for k, d in got] == [
        ("status", None),
        ("metric", 1),
        ("metric", 2),
        ("metric", 3),
        ("end", None),
    ]


def test_stream_gives_each_whole_message_up_to_the_end() -> None:
    """RelaxClient.stream: (kind, data) of each message, its data lines joined; a comment is no message, and
    nothing after `end` is read."""
    body = (
        b'id: e1.m0\nevent: status\ndata: {"status":\ndata: "RUNNING"}\n\n'
        b": keep-alive\n\n"
        b'event: log\ndata: {"message": "x"}\n\n'
        b"event: end\ndata: {}\n\n"
        b'event: log\ndata: {"message": "after the end"}\n\n'
    )
    client = RelaxClient("http://relax.test", "k")
    client._http = httpx.Client(
        base_url="http://relax.test",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        ),
    )
    assert list(client.stream("job-1")) == [
        ("status", {"status": "RUNNING"}),
        ("log", {"message": "x"}),
        ("end", {}),
    ]
