"""`relaxctl up | down | status`: the embedded platform's life on this machine, through its files only.

The platform (`python -m api.embedded`) holds `$RELAX_HOME/run/platform.lock` for its life and keeps
`$RELAX_HOME/run/platform.json` current: its pid and start time, its status, its URL and each part's state.
`down` sends SIGTERM to that pid (only while the pid is still that process: pids are reused, so its start
time must match) and waits for it to exit; `status` reads the file and asks the URL's `/readyz`. Nothing here
imports the platform's own code: the CLI talks HTTP and reads files (the import contract in pyproject.toml)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from client.sdk import local_home


def home_dir(home: Path | None) -> Path:
    """`--home`, else RELAX_HOME, else `.relax` here (as the platform itself resolves it)."""
    return (home.expanduser() if home else local_home()).resolve()


@dataclass(frozen=True)
class PlatformState:
    home: Path
    state: dict[str, Any] | None  # platform.json, None when there is none (never started here)
    running: bool  # the recorded pid is still that process, and it has not reported itself stopped

    @property
    def pid(self) -> int | None:
        return int(self.state["pid"]) if self.state and self.state.get("pid") else None

    @property
    def url(self) -> str | None:
        return self.state.get("url") if self.state else None


def _same_process(pid: int, create_time: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        return create_time is None or abs(proc.create_time() - float(create_time)) <= 1
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def read_state(home: Path) -> PlatformState:
    run_dir = home / "run"
    try:
        state = json.loads((run_dir / "platform.json").read_text())
    except (OSError, ValueError):
        state = None
    pid = state.get("pid") if state else None
    # the pid recorded, still that process (pids are reused), and not yet past its own stop
    running = (
        bool(pid) and state.get("status") != "stopped" and _same_process(int(pid), state.get("create_time"))
    )
    return PlatformState(home, state, running)


def readiness(url: str, timeout: float = 3.0) -> tuple[bool, dict[str, Any] | str]:
    """`GET /readyz`: (ready, its body), or (False, why it could not be asked)."""
    try:
        r = httpx.get(f"{url.rstrip('/')}/readyz", timeout=timeout)
    except httpx.HTTPError as e:
        return False, f"{url} does not answer ({type(e).__name__})"
    try:
        body: dict[str, Any] | str = r.json()
    except ValueError:
        body = r.text[:200]
    return r.status_code == 200, body


def start_detached(home: Path, port: int | None, *, wait_s: float = 180.0) -> tuple[int, PlatformState]:
    """Start `python -m api.embedded` in a session of its own (it outlives this command), its output appended
    to `$home/logs/platform.log`; wait until its state says running and its API is ready, or it exited.
    Returns (its exit code or 0, the state)."""
    env = os.environ.copy() | {"RELAX_HOME": str(home)}
    if port is not None:
        env["RELAX_PORT"] = str(port)
    (home / "logs").mkdir(parents=True, exist_ok=True)
    log_path = home / "logs" / "platform.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.embedded"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in this terminal does not reach it; `relaxctl down` stops it
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code, read_state(home)
        state = read_state(home)
        if state.running and state.pid == proc.pid and state.url and state.state.get("status") == "running":
            ready, _ = readiness(state.url, timeout=1.0)
            if ready:
                return 0, state
        time.sleep(0.5)
    return -1, read_state(home)


def stop(home: Path, *, wait_s: float = 60.0) -> tuple[str, PlatformState]:
    """SIGTERM the platform of `home` and wait until it let go of its lock. Returns (what happened, state):
    "stopped", "not-running", or "timeout" (still running after `wait_s`)."""
    state = read_state(home)
    if not state.running or state.pid is None:
        return "not-running", state
    try:
        proc = psutil.Process(state.pid)
        proc.send_signal(signal.SIGTERM)  # it stops its parts in order, then exits
        proc.wait(timeout=wait_s)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return "timeout", read_state(home)
    return "stopped", read_state(home)
