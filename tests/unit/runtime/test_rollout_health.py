"""The rollout health check's decisions without Ray (runtime/rollout/health.py): when a round is due (first
wait, interval), what a probe's outcome means (timeout, refusal, status), and the restart budget. The probe
runs against real local HTTP servers: one that answers, one that never does, and a closed port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from runtime.rollout.health import (
    HEALTH_ENDPOINT,
    HealthCheckConfig,
    HealthMonitor,
    RestartBudgetExceeded,
    Verdict,
    classify,
    probe,
)


def test_config_from_values_is_none_without_the_flag_and_relax_defaults_with_it() -> None:
    assert HealthCheckConfig.from_values({}) is None
    assert (
        HealthCheckConfig.from_values({"use_health_check": False, "rollout_health_check_interval": 1}) is None
    )
    assert HealthCheckConfig.from_values({"use_health_check": True}) == HealthCheckConfig(30.0, 30.0, 0.0, 3)
    config = HealthCheckConfig.from_values(
        {
            "use_health_check": True,
            "rollout_health_check_interval": 1,
            "rollout_health_check_timeout": 2.5,
            "rollout_health_check_first_wait": 4,
            "max_global_restart": 0,
            "rollout_health_check_unknown": 9,
        }
    )
    assert config == HealthCheckConfig(interval_s=1.0, timeout_s=2.5, first_wait_s=4.0, max_restarts=0)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"interval_s": 0}, "--rollout-health-check-interval"),
        ({"timeout_s": -1}, "--rollout-health-check-timeout"),
        ({"first_wait_s": -0.5}, "--rollout-health-check-first-wait"),
        ({"max_restarts": -1}, "--max-global-restart"),
    ],
)
def test_config_refuses_bad_values_naming_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        HealthCheckConfig(**kwargs)


def test_rounds_start_after_the_first_wait_then_every_interval() -> None:
    monitor = HealthMonitor(HealthCheckConfig(interval_s=2.0, first_wait_s=5.0), started_at=100.0)
    assert not monitor.due(104.9)
    assert monitor.due(105.0) and monitor.next_round_at() == 105.0
    monitor.round_started(105.3)
    assert not monitor.due(107.2)
    assert monitor.due(107.3)
    # without a first wait the first round is at once
    assert HealthMonitor(HealthCheckConfig(interval_s=2.0), started_at=7.0).due(7.0)
    # a first wait longer than the interval is never cut short by the interval
    late = HealthMonitor(HealthCheckConfig(interval_s=1.0, first_wait_s=10.0), started_at=0.0)
    assert [late.due(t) for t in (1.0, 9.99, 10.0)] == [False, False, True]


def test_only_healthy_engines_are_kept() -> None:
    verdicts = {2: Verdict.HEALTHY, 1: Verdict.HUNG, 0: Verdict.DEAD, 3: Verdict.UNHEALTHY}
    assert list(HealthMonitor.condemned(verdicts).items()) == [
        (0, Verdict.DEAD),
        (1, Verdict.HUNG),
        (3, Verdict.UNHEALTHY),
    ]
    assert HealthMonitor.condemned({0: Verdict.HEALTHY, 1: Verdict.HEALTHY}) == {}


def test_replacements_count_against_max_global_restart_and_the_one_past_it_names_the_engine() -> None:
    monitor = HealthMonitor(HealthCheckConfig(max_restarts=2), started_at=0.0)
    assert monitor.charge(1, "hung") == 1
    assert monitor.charge(0, "dead") == 2
    with pytest.raises(RestartBudgetExceeded) as info:
        monitor.charge(1, "hung")
    assert "rollout engine 1 is hung" in str(info.value) and "--max-global-restart=2" in str(info.value)
    assert info.value.replacements == 3 and monitor.replacements == 2 and monitor.per_engine == {1: 1, 0: 1}
    with pytest.raises(RestartBudgetExceeded, match="replacement 1 of this run, past --max-global-restart=0"):
        HealthMonitor(HealthCheckConfig(max_restarts=0), started_at=0.0).charge(0, "dead")


def test_outcomes_as_verdicts() -> None:
    request = httpx.Request("GET", "http://127.0.0.1:1/health_generate")
    assert classify(200, None) is Verdict.HEALTHY
    assert classify(503, None) is Verdict.UNHEALTHY
    assert classify(401, None) is Verdict.UNHEALTHY
    assert classify(None, httpx.ReadTimeout("slow", request=request)) is Verdict.HUNG
    assert classify(None, httpx.ConnectTimeout("slow", request=request)) is Verdict.HUNG
    assert classify(None, httpx.ConnectError("refused", request=request)) is Verdict.DEAD
    assert classify(None, httpx.RemoteProtocolError("reset", request=request)) is Verdict.DEAD


@pytest.fixture
def servers() -> Iterator[dict[str, str]]:
    """An engine-like server that answers /health_generate (200 with the key, 401 without), one that accepts
    the connection and never answers (a stopped process), and a port nothing listens on."""
    release = threading.Event()
    seen: list[str | None] = []

    class Answering(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            ok = self.path == HEALTH_ENDPOINT and self.headers.get("Authorization") == "Bearer k"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Silent(Answering):
        def do_GET(self) -> None:  # noqa: N802
            release.wait(10)

    good = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    silent = ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    for server in (good, silent):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    try:
        yield {
            "good": f"127.0.0.1:{good.server_address[1]}",
            "silent": f"127.0.0.1:{silent.server_address[1]}",
            "closed": f"127.0.0.1:{closed}",
        }
    finally:
        release.set()
        for server in (good, silent):
            server.shutdown()
            server.server_close()
    assert HEALTH_ENDPOINT in seen


def test_probe_asks_health_generate_with_the_key_within_the_timeout(servers: dict[str, str]) -> None:
    assert probe(servers["good"], api_key="k", timeout_s=2.0) is Verdict.HEALTHY
    assert probe(servers["good"], api_key="wrong", timeout_s=2.0) is Verdict.UNHEALTHY
    assert probe(servers["closed"], api_key="k", timeout_s=2.0) is Verdict.DEAD
    began = time.monotonic()
    assert probe(servers["silent"], api_key="k", timeout_s=0.5) is Verdict.HUNG
    assert 0.4 < time.monotonic() - began < 3.0  # the timeout bounds the wait


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("rollout-health-check-interval", 0),
        ("rollout-health-check-timeout", -1.0),
        ("rollout-health-check-first-wait", -2.0),
        ("max-global-restart", -1),
    ],
)
def test_submission_refuses_bad_health_check_values_naming_the_field(flag: str, value: float) -> None:
    """Caught at submission (the spec's field ranges), not when the driver starts: an error naming the
    flag, with a hint."""
    from tests.unit.jobspec.test_rules import run

    res, issues = run({"use-health-check": True, flag: value})
    assert res is None
    (issue,) = [i for i in issues if i.is_error]
    assert issue.code == "spec.out_of_range" and flag in issue.fields and issue.hint, str(issue)
    res, _ = run({"use-health-check": True, flag: 1})
    assert res is not None
