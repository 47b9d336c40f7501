"""Starts the embedded platform as `make run` does, in a temp home: for end-to-end tests and benchmarks."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` set in `os.environ` for the block; each name's previous value (or its absence) restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningPlatform:
    url: str
    home: Path
    proc: subprocess.Popen[bytes]

    @property
    def key(self) -> str:
        return (self.home / "admin.key").read_text().strip()

    @property
    def ray_token(self) -> str:
        """The auth token of pool `local`'s Ray (the Jobs API refuses calls without it)."""
        return (self.home / "ray_tokens" / "local").read_text().strip()

    def env(self) -> dict[str, str]:
        return os.environ | {"RELAX_URL": self.url, "RELAX_HOME": str(self.home), "RELAX_API_KEY": self.key}

    def relaxctl(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        script = Path(sys.executable).parent / "relaxctl"
        # the venv's console script; where the package is only on PYTHONPATH (the GPU host), the module
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "client.cli"]
        return subprocess.run(
            [*argv, *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def log(self) -> str:
        parts = []
        for f in sorted((self.home / "logs").glob("*.log")) + [self.home / "platform.log"]:
            if f.exists():
                parts.append(f"==> {f.name}\n{f.read_text()[-4000:]}")
        return "\n".join(parts)


# Platforms this process started and has not stopped. Each runs in a session of its own (a terminal's Ctrl-C
# must not reach it before the harness stops it), so nothing stops it when this process ends: at exit, this
# does (a test run ended by SIGTERM, e.g. `timeout`, once left a whole platform running; tests/conftest.py
# turns SIGTERM into an orderly end, which runs this).
_STARTED: dict[int, RunningPlatform] = {}


def _stop_started() -> None:
    for node in list(_NODES):
        stop_node(node)
    for platform in list(_STARTED.values()):
        stop_platform(platform, timeout=30)


# Raylets joined to a platform's Ray head (`join_node`) and not stopped yet.
_NODES: list[subprocess.Popen[bytes]] = []


def join_node(platform: RunningPlatform, name: str, slots: int) -> subprocess.Popen[bytes]:
    """One more raylet of the platform's pool `local` on this machine (`python -m api.embedded join`, which
    becomes `ray start --address=<head> --block`), in a session of its own: its process group is that node's
    Ray processes. Its output goes to `<home>/logs/node-<name>.log`."""
    logs = platform.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"node-{name}.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.embedded", "join", name, str(slots)],
            cwd=ROOT,
            env=os.environ | {"RELAX_HOME": str(platform.home)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _NODES.append(proc)
    return proc


def stop_node(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """`sig` to the joined node's process group (SIGTERM: `ray start --block` stops its Ray processes; SIGKILL:
    the node is lost at once), then SIGKILL to whatever of it is left."""
    if proc in _NODES:
        _NODES.remove(proc)
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


atexit.register(_stop_started)


def start_platform(home: Path, *, timeout: float = 180) -> RunningPlatform:
    port = _free_port()
    env = os.environ | {"RELAX_HOME": str(home), "RELAX_PORT": str(port)}
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.embedded"],
        cwd=ROOT,
        env=env,
        stdout=open(home / "platform.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    platform = RunningPlatform(url=url, home=home, proc=proc)
    _STARTED[proc.pid] = platform
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the platform exited with {proc.returncode}:\n{platform.log()}")
        try:
            urllib.request.urlopen(f"{url}/readyz", timeout=2).read()
            if (home / "admin.key").exists():
                return platform
        except OSError:
            pass
        time.sleep(0.5)
    stop_platform(platform)
    raise RuntimeError(f"the platform did not come up in {timeout}s:\n{platform.log()}")


def stop_platform(platform: RunningPlatform, timeout: float = 60) -> float:
    """SIGTERM, as Ctrl-C would; returns how long it took to stop."""
    t0 = time.time()
    _STARTED.pop(platform.proc.pid, None)
    if platform.proc.poll() is None:
        platform.proc.send_signal(signal.SIGTERM)
        try:
            platform.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(platform.proc.pid, signal.SIGKILL)
            platform.proc.wait()
    return time.time() - t0
