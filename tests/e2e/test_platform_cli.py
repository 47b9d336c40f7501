"""`relaxctl up --detach`, `relaxctl status`, `relaxctl down` on a real embedded platform: it starts in the
background on the port and home given, reports ready with its parts, refuses a second one on the same home,
stops with every part it started, and says so when nothing runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench.harness import ROOT
from client import platform

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _relaxctl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RELAX_HOME", "RELAX_PORT", "RELAX_URL")}
    env["COLUMNS"] = "120"
    return subprocess.run(
        [sys.executable, "-m", "client.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_up_detached_status_and_down(tmp_path: Path) -> None:
    home, port = tmp_path / "home", _free_port()
    state_file = home / "run" / "platform.json"

    r = _relaxctl("status", "--home", str(home))
    assert r.returncode == 1 and "no platform runs" in r.stdout, r.stdout + r.stderr

    try:
        r = _relaxctl("up", "--detach", "--port", str(port), "--home", str(home))
        log = (
            (home / "logs" / "platform.log").read_text() if (home / "logs" / "platform.log").exists() else ""
        )
        assert r.returncode == 0, r.stdout + r.stderr + log
        assert f"http://127.0.0.1:{port}" in r.stdout and "relaxctl down" in r.stdout

        state = json.loads(state_file.read_text())
        parts = state["parts"]
        assert {"ray", "worker", "beat", "api"} <= set(parts)

        r = _relaxctl("status", "--home", str(home))
        assert r.returncode == 0 and "ready" in r.stdout and str(state["pid"]) in r.stdout, (
            r.stdout + r.stderr
        )
        assert all(name in r.stdout for name in ("ray", "worker", "beat", "api"))
        r = _relaxctl("status", "--home", str(home), "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["ready"] is True

        r = _relaxctl("up", "--detach", "--home", str(home))  # one platform per home
        assert r.returncode == 1 and "already runs" in r.stderr, r.stdout + r.stderr

        r = _relaxctl("down", "--home", str(home))
        assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
        # the platform and every part it started are gone
        for pid in [state["pid"], *(p["pid"] for p in parts.values() if p.get("pid"))]:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        assert json.loads(state_file.read_text())["status"] == "stopped"

        r = _relaxctl("status", "--home", str(home))
        assert r.returncode == 1 and "last: stopped" in r.stdout, r.stdout + r.stderr
        _assert_json_logs(home / "logs")
        r = _relaxctl("down", "--home", str(home))
        assert r.returncode == 0 and "no platform runs" in r.stdout
    finally:  # whatever failed above, nothing outlives the test
        platform.stop(home)


def _assert_json_logs(logs: Path) -> None:
    """Issue 16 item 6: every part's log is JSON lines (RELAX_LOG_FORMAT's default for a process that writes to a
    file), each naming its part. Not ours: Ray's own log, and the one line Celery prints itself at shutdown."""
    for name, part in (("platform", "supervisor"), ("api", "api"), ("worker", "worker"), ("beat", "beat")):
        text = (logs / f"{name}.log").read_text()
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith("worker: ")]
        assert lines, name
        for line in lines:
            record = json.loads(line)  # a line that is not JSON fails here, with the line
            assert record["part"] == part and record["level"] and record["message"] is not None, (name, line)


def test_up_refuses_a_port_out_of_range(tmp_path: Path) -> None:
    r = _relaxctl("up", "--port", "70000", "--home", str(tmp_path / "home"))
    assert r.returncode == 2 and "--port 70000" in r.stderr
