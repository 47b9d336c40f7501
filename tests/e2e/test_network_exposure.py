"""What the embedded platform exposes on the network, probed as an attacker would: with a job running (so its
engine server exists), every listening TCP socket of the platform's process tree (API, worker, Ray's GCS,
raylet, dashboard, agents, client server, workers, the job's driver, actors and engine server) is on a
loopback address, and none of its HTTP endpoints answers an unauthenticated request with data; Ray refuses
`ray.init` without its token, on the GCS and on the client server; neither Ray's token nor the engine
secret is on a command line, in an environment or in a log."""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
import yaml

from api.embedded import ray_temp_dir
from bench.harness import ROOT, RunningPlatform
from client.sdk import RelaxClient
from scheduler.settings import Settings
from tests.e2e.watch import until
from wire.jobs import TERMINAL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The only answers allowed without credentials, each with its reason. Everything else must be refused
# (401/403) or not exist (404/405/...).
PUBLIC = {
    "/": "static HTML of a web UI (the platform's dashboard, Ray's): it holds no data until signed in",
    "/healthz": "the API's liveness probe: {'status': 'ok'}",
    "/readyz": "the API's readiness probe for load balancers: the database answers",
    "/api/healthz": "Ray's liveness probe (dashboard, agent): 'success' lines",
    "/api/authentication_mode": "Ray's dashboard: says that token auth is on, so its UI asks for the token",
}
PROBES = [
    ("GET", "/"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/api/healthz"),
    ("GET", "/api/authentication_mode"),
    # the platform's API
    ("GET", "/v1/jobs"),
    ("GET", "/v1/pools"),
    ("GET", "/metrics"),
    # Ray: Jobs API (the unauthenticated POST that ran a command as root), state, agent, runtime-env agent
    ("GET", "/api/version"),
    ("GET", "/api/jobs/"),
    ("POST", "/api/jobs/"),
    ("GET", "/nodes?view=summary"),
    ("GET", "/api/v0/actors"),
    ("GET", "/api/cluster_status"),
    ("POST", "/api/job_agent/jobs/"),
    ("POST", "/get_or_create_runtime_env"),
    # engine servers (SGLang protocol)
    ("GET", "/health"),
    ("GET", "/get_server_info"),
    ("POST", "/generate"),
    ("POST", "/update_weights_from_tensor"),
    ("POST", "/release_memory_occupation"),
]
BODIES = {
    "/api/jobs/": {"entrypoint": "cat admin.key"},
    "/api/job_agent/jobs/": {"entrypoint": "cat admin.key", "submission_id": "x"},
    "/generate": {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}},
    "/update_weights_from_tensor": {"serialized_named_tensors": [""], "load_format": "relax_safetensors"},
}
RAY_INIT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR")
    print("CONNECTED", ray.get(ray.remote(lambda: open(sys.argv[2]).read()).remote()))
except Exception as exc:
    print("REFUSED", type(exc).__name__)
"""


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    pid: int
    cmdline: str

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.ip.split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return address.is_loopback or (mapped is not None and mapped.is_loopback)

    @property
    def connect_host(self) -> str:
        return "::1" if self.ip == "::1" else "127.0.0.1"


def _tree(root: int) -> list[psutil.Process]:
    parent = psutil.Process(root)
    return [parent, *parent.children(recursive=True)]


def _argv(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.NoSuchProcess:  # (ZombieProcess too) one that has just exited
        return []


def _listeners(root: int) -> list[Listener]:
    found = []
    for proc in _tree(root):
        try:
            cmdline = " ".join(proc.cmdline())
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append(Listener(conn.laddr.ip, conn.laddr.port, proc.pid, cmdline))
        except psutil.NoSuchProcess:
            continue
    return found


def _speaks_http1(listener: Listener) -> bool:
    """A gRPC server (HTTP/2 only) answers an HTTP/1.1 request with binary frames or closes."""
    try:
        with socket.create_connection((listener.connect_host, listener.port), timeout=3) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/1.")
    except OSError:
        return False


def _request(listener: Listener, method: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(listener.connect_host, listener.port, timeout=10)
    try:
        body = json.dumps(BODIES.get(path.split("?")[0], {})).encode() if method == "POST" else None
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _ray_init_without_token(address: str, secret_file: Path, home: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # disabled: no token sent; single-machine mode: 127.0.0.1 is not rewritten to this host's address
    env |= {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HOME": str(home)}
    return subprocess.Popen(
        [sys.executable, "-c", RAY_INIT, address, str(secret_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def platform(three_slot_platform: RunningPlatform) -> Iterator[RunningPlatform]:
    """tests/e2e/conftest.py's platform of three slots, shared with the modules next to this one in the first lane
    (test_megatron_learns before, test_reliability after); the job cancelled here has ended before the module
    does (the platform's contract: no job of a module left running for the next)."""
    p = three_slot_platform
    yield p
    c = RelaxClient(p.url, p.key)
    for job in c.list_jobs(name="exposure", limit=100)["data"]:
        if job["status"] not in TERMINAL:
            c.cancel_job(job["id"])
        until(lambda j=job["id"]: c.get_job(j)["status"] in TERMINAL, 120, c, p, job["id"])


def test_nothing_listens_beyond_loopback_and_nothing_answers_without_credentials(
    platform: RunningPlatform, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    began = time.monotonic()
    c = RelaxClient(platform.url, platform.key)
    ray_token = platform.ray_token
    admin_key = platform.key

    # ray.init without the token, on the GCS and on the Ray client server: run while the job starts.
    head_argv = next(
        argv for argv in map(_argv, _tree(platform.proc.pid)) if {"start", "--head"} <= set(argv)
    )

    def head_port(flag: str) -> int:
        return int(head_argv[head_argv.index(flag) + 1])

    gcs, client_port = head_port("--port"), head_port("--ray-client-server-port")
    attempts = [
        _ray_init_without_token(f"127.0.0.1:{gcs}", platform.home / "admin.key", tmp_path),
        _ray_init_without_token(f"ray://127.0.0.1:{client_port}", platform.home / "admin.key", tmp_path),
    ]
    request.addfinalizer(lambda: [a.kill() for a in attempts if a.poll() is None])

    # A job whose roles are up: trainer and engine server (the built-in SGLang-protocol server). Not colocated:
    # a colocated job hosts its engine inside the trainer's actor, with no server to probe.
    spec = dict(yaml.safe_load((ROOT / "examples" / "grpo-arith.yaml").read_text())["spec"])
    spec["colocate"] = False
    for key in ("save", "save-interval", "save-hf", "eval-interval", "eval-prompt-data"):
        spec.pop(key)
    spec |= {"hf-checkpoint": "artifacts://models/tiny", "ref-load": "artifacts://models/tiny"}
    spec |= {"num-rollout": 10_000, "rollout-batch-size": 4, "n-samples-per-prompt": 2}
    spec |= {"global-batch-size": 8, "micro-batch-size": 8}
    job = c.submit_job(spec=spec, name="exposure")
    deadline = time.time() + 150
    while (job := c.get_job(job["id"]))["status"] != "RUNNING":
        assert job["status"] in ("QUEUED", "ADMITTED", "STARTING") and time.time() < deadline, (
            job["status"] + platform.log()
        )
        time.sleep(0.5)

    running_at = time.monotonic() - began
    try:
        listeners = _listeners(platform.proc.pid)
        engines = [ln for ln in listeners if "runtime.rollout.sglang.server" in ln.cmdline]
        assert engines, "the running job has no engine server"
        exposed = [ln for ln in listeners if not ln.loopback]
        assert not exposed, f"listening beyond loopback: {exposed}"

        api_port = urlparse(platform.url).port
        ray_port = urlparse(c.pools()[0]["ray_address"]).port
        http_listeners = [ln for ln in listeners if _speaks_http1(ln)]
        assert {api_port, ray_port} | {e.port for e in engines} <= {ln.port for ln in http_listeners}
        answered: dict[tuple[int, str, str], int] = {}
        for ln in http_listeners:
            index = _request(ln, "GET", "/")
            for method, path in PROBES:
                status, body = _request(ln, method, path)
                answered[ln.port, method, path] = status
                assert ray_token.encode() not in body and admin_key.encode() not in body, (ln, path)
                if 200 <= status < 300:
                    static = index[0] == 200 and body == index[1]  # a web UI's page for any path
                    assert path.split("?")[0] in PUBLIC or static, (
                        f"{method} {path} on {ln} answered {status} without credentials: {body[:200]!r}"
                    )
                    assert path == "/" or static or len(body) < 200, (ln, path, body)

        # What each kind of server says to the requests that matter.
        assert answered[api_port, "GET", "/v1/jobs"] == 401
        assert answered[api_port, "GET", "/metrics"] == 401
        assert answered[ray_port, "POST", "/api/jobs/"] in (401, 403)
        assert answered[ray_port, "GET", "/api/version"] in (401, 403)
        for engine in engines:
            assert {answered[engine.port, m, p] for m, p in PROBES} == {401}, engine
        agent = head_port("--dashboard-agent-listen-port")
        assert answered[agent, "POST", "/api/job_agent/jobs/"] in (401, 403)
        assert answered[head_port("--runtime-env-agent-port"), "POST", "/get_or_create_runtime_env"] in (
            401,
            403,
        )

        # The engine secret went to its server in a --config file, gone once read; never on a command line.
        for engine in engines:
            argv = engine.cmdline.split()
            assert "--api-key" not in argv and not Path(argv[argv.index("--config") + 1]).exists()
        # Ray's token: in no command line and no environment of the tree (Ray reads it from its file).
        for proc in _tree(platform.proc.pid):
            try:
                assert ray_token not in " ".join(proc.cmdline()), proc
                assert ray_token not in "".join(proc.environ().values()), proc
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        token_file = Settings(home=platform.home).ray_token_path("local")
        assert token_file.stat().st_mode & 0o777 == 0o600
    finally:
        c.cancel_job(job["id"])

    for attempt in attempts:
        out, _ = attempt.communicate(timeout=max(5.0, 90 - (time.monotonic() - began)))
        assert "REFUSED" in out and "CONNECTED" not in out and admin_key not in out, out

    # Nor in a log: the platform's, Ray's session (GCS, raylet, dashboard, agents, workers, job drivers).
    logs = [*(platform.home / "logs").glob("*.log"), platform.home / "platform.log"]
    logs += [f for f in (ray_temp_dir(Settings(home=platform.home)) / "session_latest" / "logs").rglob("*")]
    for f in logs:
        if f.is_file():
            assert ray_token not in f.read_text(errors="replace"), f
    print(
        f"exposure: {len(listeners)} listeners, {len(http_listeners)} speak HTTP; job running after "
        f"{running_at:.0f} s, all checked after {time.monotonic() - began:.0f} s"
    )
    if os.environ.get("RELAX_TEST_VERBOSE"):
        for ln in sorted(listeners, key=lambda ln: ln.cmdline):
            print(ln.ip, ln.port, ln.cmdline[:100])
        for key, status in sorted(answered.items()):
            print(*key, status)
