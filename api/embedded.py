"""The embedded platform on one machine: API, scheduler beat, one Celery worker, local Ray, SQLite.

`python -m api.embedded` (what `make run` and `relaxctl up` start). This process is the platform's
supervisor (docs/reliability.md):

- it starts the Ray head, the Celery worker, the beat and the API server (uvicorn) as child processes and
  polls them; one that dies is restarted after a backoff (1, 2, 4, ... s), within a budget (5 deaths in
  5 minutes; 3 for Ray), else the platform stops cleanly and says why (exit code 1). A Ray head that stops
  answering is restarted too; the jobs it ran are then resumed from their checkpoints by the reconciler;
- its children die with it: each is started with `PR_SET_PDEATHSIG` (SIGKILL; SIGTERM for `ray start`,
  which then stops Ray's own processes), so a SIGKILL of this process leaves no worker, beat or API behind;
- one platform per RELAX_HOME: `$RELAX_HOME/run/platform.lock` (flock) is held for its life; a second one
  refuses to start, naming the first. A platform that died without stopping (SIGKILL, power loss) left its
  state in `$RELAX_HOME/run/platform.json`: the next start stops whatever of it survived (its recorded
  processes, and every Ray process of this home's Ray temp dir) before starting anew;
- the state of every part goes to `$RELAX_HOME/run/platform.json`, which `/readyz` reads (503 while a part
  is down).

Stops everything it started on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import hashlib
import json
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from runtime.redaction import install_log_redaction
from scheduler.celery_app import worker_argv
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.dispatch import SCHEDULER_QUEUE, pool_queue
from scheduler.health import SUPERVISOR_STATE_ENV
from scheduler.logs import configure_logging, uvicorn_log_config
from scheduler.observability import METRICS_DIR_ENV, MULTIPROC_ENV, clean_dir
from scheduler.secret_files import ensure_private_dir
from scheduler.services.platform import LocalPool, ensure_admin_key, ensure_local_pool, ensure_team
from scheduler.settings import Settings, get_settings

log = logging.getLogger("relax.embedded")
LOCAL_POOL = "local"

POLL_SECONDS = 0.5  # how often the supervisor looks at its children
RESTART_WINDOW_SECONDS = 300.0  # deaths counted against a part's budget
MAX_BACKOFF_SECONDS = 30.0
RAY_PROBE_SECONDS = 5.0  # the Ray head must answer its Jobs API ...
RAY_PROBE_FAILURES = 3  # ... or it is restarted after this many failed probes in a row


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int, *, avoid: frozenset[int] = frozenset()) -> list[int]:
    """`n` distinct free ports, none in `avoid`: every socket stays bound until all are chosen. (One
    `free_port()` after another can hand out the same port twice: Ray then refused to start, "Ray component
    metrics_export is trying to use a port number … that is used by other components", and a platform
    starting again after a crash exited; chaos trials.)"""
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in avoid:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


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


# ---- children that die with their parent --------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_LIBC: Any = None
if sys.platform.startswith("linux"):
    try:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # no libc to call: children are then stopped by stop() only
        _LIBC = None


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` making the child get `sig` when this process (more exactly: the thread that starts it,
    so children are only ever started from the main thread) dies; it exits at once if the parent died
    before the call took effect. None off Linux."""
    if _LIBC is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def spawn(
    logs: Path, name: str, argv: list[str], env: dict[str, str] | None, death_signal: int
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (Ctrl-C in a terminal reaches only this process, which stops the
    children in order), its output appended to `logs/<name>.log`, dying with this process."""
    logs.mkdir(parents=True, exist_ok=True)
    out: IO[bytes] = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the child's for its lifetime
    try:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or os.environ.copy(),
            start_new_session=True,
            preexec_fn=die_with_parent(death_signal),
        )
    finally:
        out.close()  # the child has its own copy


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Children:
    """The processes the embedded platform starts, stopped in reverse order (tests start a Ray head with it)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        *,
        death_signal: int = signal.SIGKILL,
    ) -> subprocess.Popen[bytes]:
        proc = spawn(self.logs, name, argv, env, death_signal)
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        stop_processes(self.procs)


def stop_processes(procs: list[tuple[str, subprocess.Popen[bytes]]], timeout: float = 15) -> None:
    """SIGTERM each (in reverse order), wait, then SIGKILL whatever is left in their process groups (Ray's
    daemons)."""
    for _name, proc in reversed(procs):
        if proc.poll() is None:
            _kill_group(proc.pid, signal.SIGTERM)
    deadline = time.time() + timeout
    for name, proc in reversed(procs):
        try:
            proc.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", name)
        _kill_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


# ---- Ray --------------------------------------------------------------------------------------------------
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
    env.pop(SUPERVISOR_STATE_ENV, None)
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")  # stop at once on SIGTERM
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a node that stops answering (a joined raylet SIGKILLed) is held dead after ~5 s instead of Ray's ~15 s
    env.setdefault("RAY_health_check_period_ms", "1000")
    env.setdefault("RAY_health_check_failure_threshold", "5")
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_enable_metrics_collection": "0",
        "DASHBOARD_METRIC_PORT": "-1",
    }
    return env


@dataclass
class RayHead:
    """How to start the embedded Ray head (again): fresh free ports each time; `address` is the Jobs API of
    the latest start."""

    settings: Settings
    pool: str = LOCAL_POOL
    address: str = ""
    gcs_address: str = ""  # where another raylet joins (`ray start --address`): `python -m api.embedded join`

    @property
    def token(self) -> str | None:
        return self.settings.ray_token(self.pool)

    def command(self) -> tuple[list[str], dict[str, str]]:
        # Every port Ray would otherwise take at a fixed default (GCS 6379 is Redis's, the agent's 52365
        # and the client server's 10001 collide with any other Ray on the machine) is chosen free.
        flags = (
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
        # distinct, and never the API's port (the API starts after Ray)
        ports = dict(
            zip(flags, free_ports(len(flags), avoid=frozenset({self.settings.api.port})), strict=True)
        )
        temp = ensure_private_dir(
            ray_temp_dir(self.settings)
        )  # sockets, session and job logs: this user only
        token_path = self.settings.ensure_ray_token(self.pool)
        num_cpus = self.settings.ray.num_cpus or max(8, 2 * (os.cpu_count() or 2))
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
            # Ray names its node as the pool does (`bootstrap`), so that its node list binds the pool's node by
            # name even when other raylets joined before the first sync (`platform.sync_ray_nodes`)
            "--node-name",
            local_node_name(),
        ]
        for flag, port in ports.items():
            argv += [flag, str(port)]
        self.address = f"http://127.0.0.1:{ports['--dashboard-port']}"
        self.gcs_address = f"127.0.0.1:{ports['--port']}"
        return argv, ray_environment(token_path)

    def answers(self, timeout: float = 2) -> bool:
        probe = urllib.request.Request(
            f"{self.address}/api/version", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            urllib.request.urlopen(probe, timeout=timeout).read()
            return True
        except OSError:
            return False

    def wait(self, proc: subprocess.Popen[bytes], logs: Path, timeout: float = 120) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.answers():
                return self.address
            if proc.poll() is not None:
                raise RuntimeError(f"Ray exited with code {proc.returncode}; see {logs / 'ray.log'}")
            time.sleep(0.5)
        raise RuntimeError(f"Ray did not come up in {timeout:.0f} s; see {logs / 'ray.log'}")


def local_node_name() -> str:
    """The name of the embedded pool's node (this host's), which the embedded Ray head's node carries too."""
    return socket.gethostname() or "local"


def head_file(settings: Settings) -> Path:
    """`$RELAX_HOME/run/ray-head.json`: the embedded Ray head's addresses, for raylets that join it."""
    return settings.home / "run" / "ray-head.json"


def write_head_file(settings: Settings, head: RayHead) -> None:
    path = head_file(settings)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"gcs_address": head.gcs_address, "jobs_address": head.address}))
    os.replace(tmp, path)


def join_command(
    settings: Settings, *, name: str, slots: int, accelerator: str = "cpu"
) -> tuple[list[str], dict[str, str]]:
    """The arguments of `ray start` (`run_ray_join`) and its environment: `--address=<the embedded head> --block`
    of one more raylet of pool `local` on this machine:
    a node of its own named `name` that advertises `slots` slots (GPUs; on a CPU pool, CPUs: what the driver's
    bundles ask for), with the pool's token, the head's temp dir (so that the platform's stop and clean-up
    reach it) and free ports. The pool's reconciler adds it from Ray's node list within a tick."""
    head = json.loads(head_file(settings).read_text())
    flags = (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    )
    ports = dict(zip(flags, free_ports(len(flags), avoid=frozenset({settings.api.port})), strict=True))
    argv = [
        "--block",
        "--address",
        head["gcs_address"],
        "--node-ip-address",
        "127.0.0.1",
        "--node-name",
        name,
        "--temp-dir",
        str(ray_temp_dir(settings)),
        "--disable-usage-stats",
    ]
    argv += ["--num-cpus", str(slots)] if accelerator == "cpu" else ["--num-gpus", str(slots)]
    for flag, port in ports.items():
        argv += [flag, str(port)]
    env = ray_environment(settings.ray_token_path(LOCAL_POOL))
    env.setdefault(
        "RAY_agent_register_timeout_ms", "120000"
    )  # a busy machine starts the node's agents slowly
    return argv, env


def run_ray_join(argv: list[str]) -> None:
    """Run `ray start <argv>` (a node joining a head) in this process, in Ray's single-machine mode
    (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, as the head: the node's address and listeners stay 127.0.0.1). Ray's
    CLI refuses to join a node in that mode, and outside it replaces every loopback address (the head's, the
    node's own) by the machine's network address, where the head does not listen: both are turned off here."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as ray_services
    from ray.scripts.scripts import cli

    ray_constants.ENABLE_RAY_CLUSTER = True  # past the CLI's refusal
    ray_services.resolve_ip_for_localhost = lambda host: host  # 127.0.0.1 stays 127.0.0.1
    cli.main(args=["start", *argv], prog_name="ray")


def join_main(args: list[str]) -> None:
    """`python -m api.embedded join NAME [SLOTS]`: this process becomes one more raylet of the embedded
    platform of `RELAX_HOME` (it runs until stopped; SIGTERM stops its Ray processes)."""
    if not args or len(args) > 2 or not (len(args) == 1 or args[1].isdigit()):
        print("usage: python -m api.embedded join NAME [SLOTS]", file=sys.stderr)
        sys.exit(2)
    settings = get_settings()
    if not head_file(settings).exists():
        print(f"no embedded Ray head runs on RELAX_HOME={settings.home}", file=sys.stderr)
        sys.exit(1)
    accelerator, slots = detect_slots(settings)
    argv, env = join_command(
        settings, name=args[0], slots=int(args[1]) if len(args) == 2 else slots, accelerator=accelerator
    )
    os.environ.clear()
    os.environ.update(env)  # before Ray is imported: it reads its settings from the environment
    run_ray_join(argv)


def start_ray(children: Children, settings: Settings, pool: str = LOCAL_POOL) -> str:
    """A local Ray head, listening on 127.0.0.1 only, with token auth on (the token: the pool's file
    under `settings.ray_token_path`, created 0600 here); returns its Jobs API address."""
    head = RayHead(settings, pool)
    argv, env = head.command()
    proc = children.start("ray", argv, env=env, death_signal=signal.SIGTERM)
    return head.wait(proc, children.logs)


def ray_processes(temp: Path, token_path: Path | None = None) -> list[psutil.Process]:
    """Every process of the Ray whose temp dir is `temp` (`ray start`, GCS, raylet, dashboard, log monitor,
    agents): they name the dir, or a session under it, on their command line. With `token_path`, also every
    process that inherited it as `RAY_AUTH_TOKEN_PATH` from that Ray (its workers and its jobs' drivers,
    which name neither: a driver runs in a session of its own and outlived a SIGKILLed GCS, training on
    beside the attempt that resumed its job; chaos trials)."""
    prefix = f"{temp}{os.sep}"
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            if proc.info["uids"] is not None and proc.info["uids"].real != os.getuid():
                continue
            argv = proc.info["cmdline"] or []
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.pid == os.getpid():
            continue
        if any(a == str(temp) or a.endswith(f"={temp}") or prefix in a for a in argv):
            found.append(proc)
        elif token_path is not None:
            try:
                if proc.environ().get("RAY_AUTH_TOKEN_PATH") == str(token_path):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
    return found


def stop_ray_of(temp: Path, timeout: float = 10, *, token_path: Path | None = None) -> int:
    """`ray stop` for one Ray only (Ray's own stops every Ray of the user on the machine, a test's too):
    SIGTERM to the processes of the Ray with temp dir `temp` (and, with `token_path`, to every process it
    started: `ray_processes`), SIGKILL to what is left after `timeout`. Returns how many there were."""
    procs = ray_processes(temp, token_path)
    if not procs:
        return 0
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def bootstrap(settings: Settings, ray_address: str | None) -> tuple[str, int]:
    """Migrate the database and make sure the default team, pool `local` (with its Ray's address) and the
    admin key exist."""
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
                    node=local_node_name(),
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


# ---- the supervisor ----------------------------------------------------------------------------------------
@dataclass
class Part:
    """One supervised child process."""

    name: str
    command: Callable[[], tuple[list[str], dict[str, str] | None]]  # argv and environment, at each (re)start
    death_signal: int = signal.SIGKILL  # what it gets when the supervisor dies
    budget: int = 5  # deaths within RESTART_WINDOW_SECONDS tolerated; one more stops the platform
    ready: Callable[[subprocess.Popen[bytes]], object] | None = None  # blocks until it serves; raises if not
    probe: Callable[[], bool] | None = None  # while running: does it still serve?
    restarted: Callable[[], None] | None = None  # after a restart came up (Ray: the pool's new address)
    proc: subprocess.Popen[bytes] | None = None
    state: str = "stopped"  # starting | running | restarting | stopped | failed
    since: float = 0.0  # when it entered its state (a restarted worker counts once it heartbeats after this)
    create_time: float | None = None
    restarts: int = 0
    deaths: deque[float] = field(default_factory=deque)
    restart_at: float | None = None
    probe_failures: int = 0
    next_probe: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid if self.proc else None,
            "create_time": self.create_time,
            "state": self.state,
            "since": self.since,
            "restarts": self.restarts,
            "detail": self.detail,
        }


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    """Starts, polls and restarts the platform's processes; writes their state for /readyz."""

    def __init__(
        self, logs: Path, state_file: Path | None, *, window: float = RESTART_WINDOW_SECONDS
    ) -> None:
        self.logs, self.state_file, self.window = logs, state_file, window
        self.parts: dict[str, Part] = {}
        self.fatal: str | None = None  # why the platform stops on its own
        self.stop_requested: str | None = None
        self.started_at = time.time()
        self.url: str | None = None  # the API's, for `relaxctl status` and `relaxctl down`
        self._written = 0.0

    # -- parts --------------------------------------------------------------------------------------------
    def add(self, part: Part) -> Part:
        self.parts[part.name] = part
        return part

    def start(self, name: str) -> None:
        """(Re)start a part; for one with `ready`, wait until it serves (a failure counts as a death)."""
        part = self.parts[name]
        argv, env = part.command()
        part.state, part.since, part.restart_at, part.probe_failures = "starting", time.time(), None, 0
        self.write_state(force=True)
        part.proc = spawn(self.logs, name, argv, env, part.death_signal)
        try:
            part.create_time = psutil.Process(part.proc.pid).create_time()
        except psutil.NoSuchProcess:
            part.create_time = None
        if part.ready is not None:
            part.ready(part.proc)
        part.state, part.since, part.next_probe = "running", time.time(), time.time() + RAY_PROBE_SECONDS
        if part.restarts:  # what the last death was, for whoever reads platform.json
            part.detail = f"restarted {part.restarts} time(s); last: {part.detail.split(';')[0]}"
        self.write_state(force=True)
        log.info("%s started (pid %s)", name, part.proc.pid)

    def poll(self) -> None:
        """One look at every part: a dead one is scheduled for a restart (or the platform stops), a part
        due is restarted, a part with a probe is probed."""
        now = time.time()
        for part in list(self.parts.values()):
            if self.fatal:
                return
            if part.state == "running" and part.proc is not None:
                code = part.proc.poll()
                if code is None and part.probe is not None and now >= part.next_probe:
                    part.next_probe = now + RAY_PROBE_SECONDS
                    if part.probe():
                        part.probe_failures = 0
                    else:
                        part.probe_failures += 1
                        if part.probe_failures >= RAY_PROBE_FAILURES:
                            log.error("%s stopped answering; stopping it", part.name)
                            self._terminate(part)
                            self._died(part, f"stopped answering for {RAY_PROBE_FAILURES} probes in a row")
                            continue
                if code is not None:
                    self._died(part, describe_exit(code))
            if part.state == "restarting" and part.restart_at is not None and time.time() >= part.restart_at:
                part.restarts += 1
                try:
                    self.start(part.name)
                    if part.restarted is not None:
                        part.restarted()
                    log.warning("%s restarted (restart %d)", part.name, part.restarts)
                except Exception as err:  # noqa: BLE001 - it did not come up: one more death
                    log.error("%s did not come back: %s", part.name, err)
                    if part.proc is not None and part.proc.poll() is None:
                        self._terminate(part)
                    self._died(part, f"did not come back: {err}")
        self.write_state()

    def _terminate(self, part: Part) -> None:
        assert part.proc is not None
        _kill_group(part.proc.pid, signal.SIGTERM)
        try:
            part.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(part.proc.pid, signal.SIGKILL)
        try:
            part.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def _died(self, part: Part, how: str) -> None:
        now = time.time()
        if part.proc is not None:
            _kill_group(part.proc.pid, signal.SIGKILL)  # whatever it left in its process group
        part.deaths.append(now)
        while part.deaths and now - part.deaths[0] > self.window:
            part.deaths.popleft()
        died = len(part.deaths)
        if died > part.budget:
            part.state, part.since = "failed", now
            part.detail = f"{how}; {died} deaths in {self.window:.0f}s"
            self.fatal = (
                f"the {part.name} {how} (death {died} in {self.window:.0f}s): not restarted again; "
                f"see {self.logs / (part.name + '.log')}"
            )
            log.error("%s", self.fatal)
        else:
            backoff = min(MAX_BACKOFF_SECONDS, 2.0 ** (died - 1))
            part.state, part.since, part.restart_at = "restarting", now, now + backoff
            part.detail = f"{how}; restarting in {backoff:.0f}s"
            log.error(
                "%s %s; restarting it in %.0fs (%d death(s) in %.0fs)",
                part.name,
                how,
                backoff,
                died,
                self.window,
            )
        self.write_state(force=True)

    def run(self) -> None:
        """Poll until a stop is requested or a part is past its budget."""
        while not self.stop_requested and not self.fatal:
            self.poll()
            time.sleep(POLL_SECONDS)

    def stop_all(self) -> None:
        for part in self.parts.values():
            if part.state not in ("failed",):
                part.state = "stopping"
        self.write_state(force=True, status="stopping")
        stop_processes([(p.name, p.proc) for p in self.parts.values() if p.proc is not None])
        for part in self.parts.values():
            part.state = "stopped" if part.state == "stopping" else part.state

    # -- state -------------------------------------------------------------------------------------------
    def write_state(self, *, force: bool = False, status: str | None = None) -> None:
        """`platform.json`: this process and every part, atomically (at most once a second unless forced)."""
        if self.state_file is None or (not force and time.time() - self._written < 1.0):
            return
        self._written = time.time()
        body = {
            "pid": os.getpid(),
            "create_time": psutil.Process().create_time(),
            "status": status or ("failed" if self.fatal else "running"),
            "reason": self.fatal or self.stop_requested,
            "started_at": self.started_at,
            "url": self.url,
            "updated_at": time.time(),
            "parts": {name: p.to_dict() for name, p in self.parts.items()},
        }
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.state_file)


# ---- one platform per home ---------------------------------------------------------------------------------
class AlreadyRunning(RuntimeError):
    pass


def take_home_lock(run_dir: Path) -> int:
    """Hold `run_dir/platform.lock` for this process's life (the kernel lets go of it when the process dies,
    however it dies). AlreadyRunning when another platform holds it."""
    fd = os.open(run_dir / "platform.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        state = _read_json(run_dir / "platform.json")
        who = f" (pid {state['pid']})" if state and state.get("pid") else ""
        raise AlreadyRunning(
            f"another Relax Platform{who} runs on RELAX_HOME={run_dir.parent}: stop it first "
            "(Ctrl-C, or kill -TERM its pid), or use another RELAX_HOME"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def clean_leftovers(settings: Settings, state_file: Path) -> list[str]:
    """Stop what a platform that died on this home left running: the processes its state file records
    (when they are still those processes), and every process of this home's Ray. Returns what was done."""
    done = []
    state = _read_json(state_file)
    if state and state.get("status") != "stopped":
        for name, part in (state.get("parts") or {}).items():
            pid, created = part.get("pid"), part.get("create_time")
            if not pid or created is None:
                continue
            try:
                proc = psutil.Process(int(pid))
                if abs(proc.create_time() - float(created)) > 1:
                    continue  # the pid was reused by another process
            except psutil.NoSuchProcess:
                continue
            _kill_group(int(pid), signal.SIGTERM if name == "ray" else signal.SIGKILL)
            done.append(f"stopped the previous platform's {name} (pid {pid})")
    stopped = stop_ray_of(ray_temp_dir(settings), token_path=settings.ray_token_path(LOCAL_POOL))
    if stopped:
        done.append(f"stopped {stopped} process(es) of a Ray head left on {ray_temp_dir(settings)}")
    return done


# ---- main --------------------------------------------------------------------------------------------------
def _celery(*args: str) -> list[str]:
    # --quiet: no start-up banner on stdout, so that the part's log holds only its log lines (scheduler/logs.py)
    return [sys.executable, "-m", "celery", "-A", "scheduler.worker", "--quiet", *args]


def main() -> None:
    install_log_redaction()
    try:
        log_format = configure_logging("supervisor")
    except ValueError as err:  # RELAX_LOG_FORMAT
        print(f"Relax Platform not started: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    settings = get_settings()
    ensure_private_dir(settings.home)  # 0700: the database, keys, logs and Ray's session live here
    run_dir = ensure_private_dir(settings.home / "run")
    try:
        lock = take_home_lock(run_dir)
    except AlreadyRunning as err:
        print(f"Relax Platform not started: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    state_file = run_dir / "platform.json"
    for line in clean_leftovers(settings, state_file):
        log.warning("%s", line)
    settings.artifacts.mkdir(parents=True, exist_ok=True)
    settings.signing_key()  # create it before the children race to
    sup = Supervisor(settings.home / "logs", state_file)
    host = settings.api.host if settings.api.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    sup.url = f"http://{host}:{settings.api.port}"  # where this machine reaches the API
    starting = True

    def _terminate(signum: int, _frame: object) -> None:
        sup.stop_requested = signal.Signals(signum).name
        if starting:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    code = 0
    try:
        t0 = time.time()
        env = os.environ.copy() | {"RELAX_HOME": str(settings.home), SUPERVISOR_STATE_ENV: str(state_file)}
        # Prometheus multiprocess mode (scheduler/observability.py): each part writes its measurements under its
        # own folder of run/prometheus, emptied at each start; the API's /metrics merges them all
        metrics_root = run_dir / "prometheus"
        shutil.rmtree(metrics_root, ignore_errors=True)
        env[METRICS_DIR_ENV] = str(metrics_root)

        def part_env(name: str) -> dict[str, str]:
            clean_dir(metrics_root / name)  # a restarted part starts empty (to rate(), a counter reset)
            return env | {MULTIPROC_ENV: str(metrics_root / name)}

        if settings.ray.address:
            ray_address = settings.ray.address
        else:
            head = RayHead(settings)

            def ray_command() -> tuple[list[str], dict[str, str] | None]:
                # what a dead head left outside its process group: its daemons, and its jobs' drivers (their
                # jobs are resumed on the new head; an old driver must not train on beside the new attempt)
                stop_ray_of(ray_temp_dir(settings), token_path=settings.ray_token_path(LOCAL_POOL))
                return head.command()

            def ray_restarted() -> None:
                bootstrap(settings, head.address)  # the pool's new address; its jobs are resumed
                write_head_file(settings, head)
                log.warning(
                    "Ray head restarted at %s; the jobs it ran are resumed from their checkpoints",
                    head.address,
                )

            sup.add(
                Part(
                    "ray",
                    ray_command,
                    death_signal=signal.SIGTERM,  # `ray start --block` stops Ray's processes on SIGTERM
                    budget=3,
                    ready=lambda proc: head.wait(proc, sup.logs),
                    probe=head.answers,
                    restarted=ray_restarted,
                )
            )
            sup.start("ray")
            ray_address = head.address
            write_head_file(settings, head)
        accelerator, slots = bootstrap(settings, ray_address)
        queues = f"{SCHEDULER_QUEUE},{pool_queue(LOCAL_POOL)}"
        worker = worker_argv(queues, name=f"relax-{LOCAL_POOL}@%h", threads=4)
        sup.add(Part("worker", lambda: (worker, part_env("worker"))))
        sup.add(Part("beat", lambda: (_celery("beat", "--loglevel", "INFO"), part_env("beat"))))
        api_logging = run_dir / "logging-api.json"
        api_logging.write_text(json.dumps(uvicorn_log_config("api")))
        api = [
            sys.executable,
            "-m",
            "uvicorn",
            "api.app:create_app",
            "--factory",
            "--log-config",
            str(api_logging),
        ]
        api += ["--host", settings.api.host, "--port", str(settings.api.port)]
        api += ["--log-level", "warning", "--timeout-graceful-shutdown", "3"]
        sup.add(Part("api", lambda: (api, part_env("api"))))
        for name in ("worker", "beat", "api"):
            sup.start(name)
        banner = (
            f"Relax Platform is up in {time.time() - t0:.0f}s on {settings.public_url}\n"
            f"  pool {LOCAL_POOL}: {slots} {accelerator} slot(s), Ray {ray_address}\n"
            f"  database {settings.database_url}\n"
            f"  admin key {settings.home / 'admin.key'}   logs {settings.home / 'logs'}\n"
            f"  try: .venv/bin/relaxctl models tiny && .venv/bin/relaxctl submit examples/sft-arith.yaml --wait\n"
            f"  stop: Ctrl-C here, or .venv/bin/relaxctl down --home {settings.home}"
        )
        if log_format == "text":  # a person at a terminal (or RELAX_LOG_FORMAT=text)
            print(f"\n{banner}\n", flush=True)
        else:  # one JSON line among the others
            log.info("%s", banner)
        starting = False
        sup.run()
        if sup.fatal:
            code = 1
    except KeyboardInterrupt:
        pass
    except Exception as err:  # noqa: BLE001 - said once, then everything started is stopped
        log.exception("the platform could not start")
        sup.fatal, code = f"{type(err).__name__}: {err}", 1
    finally:
        starting = False  # a signal while stopping only asks again: the cleanup runs to its end
        sup.stop_all()
        sup.write_state(force=True, status="failed" if sup.fatal else "stopped")
        os.close(lock)
    said = "Relax Platform stopped." + (f" Reason: {sup.fatal}" if sup.fatal else "")
    if log_format == "text":
        print(said, flush=True)
    else:
        log.log(logging.ERROR if sup.fatal else logging.INFO, "%s", said)
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["join"]:
        join_main(sys.argv[2:])
    else:
        main()
