"""The embedded platform on one machine: API, scheduler beat, one Celery worker, local Ray, SQLite.

`python -m api.embedded` (what `make run` and `relaxctl up` start). Stops everything it started on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import uvicorn

from runtime.redaction import install_log_redaction
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.dispatch import SCHEDULER_QUEUE, pool_queue
from scheduler.secret_files import ensure_private_dir
from scheduler.services.platform import LocalPool, ensure_admin_key, ensure_local_pool, ensure_team
from scheduler.settings import Settings, get_settings

log = logging.getLogger("relax.embedded")
LOCAL_POOL = "local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (the venv), not whatever is on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def detect_slots(settings: Settings) -> tuple[str, int]:
    """(accelerator, slots) of this machine: its GPUs, or CPU slots where there is none."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count():
            name = torch.cuda.get_device_name(0).lower()
            kind = next((k for k in ("h200", "h100", "a100", "l40", "a10") if k in name), "gpu")
            return kind, torch.cuda.device_count()
    except Exception:  # torch without CUDA support, or a broken driver: fall back to CPU slots
        pass
    return "cpu", settings.ray.local_slots or max(2, os.cpu_count() or 2)


class Children:
    """The processes the embedded platform starts, stopped in reverse order."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env or os.environ.copy(), start_new_session=True
        )
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.time() + 15
        for name, proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", name)
            try:  # whatever the child left in its process group (Ray's daemons, prefork children)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def ray_temp_dir(settings: Settings) -> Path:
    """Ray's `--temp-dir`: `$RELAX_HOME/ray`, or a folder of the system's temp dir named after the home
    when that path is too long (Unix socket paths under it must stay short: 107 bytes with Ray's session
    suffixes)."""
    temp = settings.home / "ray"
    if len(str(temp)) > 40:
        temp = (
            Path(tempfile.gettempdir())
            / f"relax-ray-{hashlib.sha1(str(settings.home).encode()).hexdigest()[:10]}"
        )
    return temp


def ray_environment(token_path: Path) -> dict[str, str]:
    """The environment of the embedded `ray start`: token auth on, loopback only, no metrics servers.

    - `RAY_AUTH_MODE=token` with `RAY_AUTH_TOKEN_PATH`: every gRPC and HTTP endpoint of Ray (GCS, raylet,
      dashboard and its Jobs API, dashboard agent, runtime-env agent, client server) wants the token;
      Ray's processes (workers, job drivers) inherit the path and read the file. The token itself is
      never in an environment or on a command line.
    - `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: Ray's single-machine mode (its default on macOS/Windows):
      the node's address is 127.0.0.1 and every listener Ray opens binds it; no other node can join.
    - `RAY_enable_metrics_collection=0` and `DASHBOARD_METRIC_PORT=-1`: no Prometheus servers, which
      answer without credentials (the dashboard's own metrics server fails to bind, logged once in
      dashboard.log; Ray has no switch for it). `--no-monitor` in the argv drops the autoscaler's.
    """
    env = os.environ.copy()
    env.pop("RAY_AUTH_TOKEN", None)  # it would override the file
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")  # stop at once on SIGTERM
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_enable_metrics_collection": "0",
        "DASHBOARD_METRIC_PORT": "-1",
    }
    return env


def start_ray(children: Children, settings: Settings, pool: str = LOCAL_POOL) -> str:
    """A local Ray head, listening on 127.0.0.1 only, with token auth on (the token: the pool's file
    under `settings.ray_token_path`, created 0600 here); returns its Jobs API address."""
    # Every port Ray would otherwise take at a fixed default (GCS 6379 is Redis's, the agent's 52365
    # and the client server's 10001 collide with any other Ray on the machine) is chosen free.
    ports = {
        flag: free_port()
        for flag in (
            "--port",
            "--dashboard-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--ray-client-server-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
            "--node-manager-port",
            "--object-manager-port",
        )
    }
    dash = ports["--dashboard-port"]
    temp = ensure_private_dir(ray_temp_dir(settings))  # Ray's sockets, session and job logs: this user only
    token_path = settings.ensure_ray_token(pool)
    token = settings.ray_token(pool)
    env = ray_environment(token_path)
    num_cpus = settings.ray.num_cpus or max(8, 2 * (os.cpu_count() or 2))
    argv = [
        _bin("ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--dashboard-host",
        "127.0.0.1",
        "--num-cpus",
        str(num_cpus),
        "--temp-dir",
        str(temp),
        "--include-dashboard",
        "true",
        "--disable-usage-stats",
        "--no-monitor",  # no autoscaling on one machine; its metrics server would answer anyone
    ]
    for flag, port in ports.items():
        argv += [flag, str(port)]
    children.start("ray", argv, env=env)
    address = f"http://127.0.0.1:{dash}"
    probe = urllib.request.Request(f"{address}/api/version", headers={"Authorization": f"Bearer {token}"})
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(probe, timeout=2).read()
            return address
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"Ray did not come up in 120 s; see {children.logs / 'ray.log'}")


def bootstrap(settings: Settings, ray_address: str | None) -> tuple[str, int]:
    """Migrate the database and make sure the default team, pool `local` and admin key exist."""
    upgrade(settings.database_url)
    accelerator, slots = detect_slots(settings)
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            team = ensure_team(s, "default")
            ensure_local_pool(
                s,
                LocalPool(
                    name=LOCAL_POOL,
                    accelerator=accelerator,
                    node=socket.gethostname() or "local",
                    slots=slots,
                    ray_address=ray_address,
                    python=sys.executable,
                ),
                team=team,
            )
            ensure_admin_key(s, settings.home / "admin.key")
    finally:
        db.dispose()
    return accelerator, slots


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    settings = get_settings()
    ensure_private_dir(settings.home)  # 0700: the database, keys, logs and Ray's session live here
    settings.artifacts.mkdir(parents=True, exist_ok=True)
    settings.signing_key()  # create it before the children race to
    children = Children(settings.home / "logs")

    def _terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    with ExitStack() as stack:
        stack.callback(children.stop)
        try:
            t0 = time.time()
            ray_address = settings.ray.address or start_ray(children, settings)
            accelerator, slots = bootstrap(settings, ray_address)
            env = os.environ.copy() | {"RELAX_HOME": str(settings.home)}
            children.start(
                "worker",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "scheduler.worker",
                    "worker",
                    "--beat",
                    "-Q",
                    f"{SCHEDULER_QUEUE},{pool_queue(LOCAL_POOL)}",
                    "-P",
                    "threads",
                    "-c",
                    "4",
                    "-n",
                    f"relax-{LOCAL_POOL}@%h",
                    "--loglevel",
                    "INFO",
                ],
                env=env,
            )
            print(
                f"\nRelax Platform is up in {time.time() - t0:.0f}s on {settings.public_url}\n"
                f"  pool {LOCAL_POOL}: {slots} {accelerator} slot(s), Ray {ray_address}\n"
                f"  database {settings.database_url}\n"
                f"  admin key {settings.home / 'admin.key'}   logs {settings.home / 'logs'}\n"
                f"  try: .venv/bin/relaxctl models tiny && .venv/bin/relaxctl submit examples/sft-arith.yaml --wait\n",
                flush=True,
            )
            uvicorn.run(
                "api.app:create_app",
                factory=True,
                host=settings.api.host,
                port=settings.api.port,
                log_level="warning",
                timeout_graceful_shutdown=3,
            )
        except KeyboardInterrupt:
            pass
    print("Relax Platform stopped.", flush=True)


if __name__ == "__main__":
    main()
