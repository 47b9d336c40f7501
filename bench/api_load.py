"""API load: submissions, listings and validations at 50 concurrent clients, beside Ray's own job REST API.

    python -m bench.api_load [--duration 20] [--clients 50] [--rate 100] [--soak SECONDS] [--json]
                             [--scenarios validate-closed,submit-open,submit-closed,list-closed,ray]

Starts the platform as production runs it (docker/entrypoint.sh): the API role (`uvicorn`, RELAX_API_WORKERS
workers) and the scheduler role (Celery worker with the beat) on PostgreSQL (a fresh schema of the local
database `test`, after a CHECKPOINT where the role may ask for one) and Redis (database 9: no test uses it),
with RELAX_ENVIRONMENT=production; and a local Ray head (token auth, 127.0.0.1, a temp dir) as the embedded
platform starts it (api/embedded.py). Then, through the admin API: 3 teams with a member key each, 2 pools of
8-GPU nodes, a queue per team and pool, and the examples' inputs in each team's area.

The load generator is one asyncio process speaking raw HTTP/1.1 over keep-alive connections with requests
serialized beforehand (a submission's body is a template with its sequence number spliced in), so that it
takes little of the 2 cores it shares with what it measures; its own CPU is printed with each scenario.
Submissions are the examples of examples/ as specs or as Relax CLI flags (`args`), with varied names, seeds,
labels, sizes, queues and priority classes; a quarter carry an idempotency key (one in 50 of those repeats an
earlier key: answered 200 with the first job). Validations are the same specs, one in 8 with a mistake.

Scenarios, in order (each row of the table; latency from the request's send, or in open loop from the time it
was due, so that a slow server is not hidden by a client that waits):

- `validate closed`: POST /v1/specs/validate, `--clients` in a closed loop for `--duration` s;
- `submit open`: POST /v1/jobs at `--rate` per second for `--duration` s (with the defaults this puts 2,000
  jobs in the queues: the scheduling passes below run over them);
- `hold`: nothing but the beat's passes over the backlog for 10 s;
- `submit closed`: POST /v1/jobs, `--clients` in a closed loop for `--duration` s;
- `list closed`: GET /v1/jobs (filters by status, queue, name; pages) in a closed loop;
- `ray submit closed|open`, `ray list closed`: POST /api/jobs/ (entrypoint `true`) and GET /api/jobs/ on
  Ray's dashboard, the same way (Ray's job submissions are bounded by `--ray-max-requests`: each starts a
  supervisor actor, a process);
- `soak` (with `--soak S`): an open-loop mix at `--rate` (submit 30%, list 25%, validate 15%, cancel 30% of
  the jobs the soak submitted, oldest first: the backlog stays where it was) for S seconds, while every
  process's RSS and PSS are sampled;
  the slope of each is printed (MiB per hour, least squares over the second half).

The scheduling passes are read from the scheduler's log (`scheduling pass: jobs=… queued=… ms=…`, one line a
pass) and summarised per phase, with the number of queued jobs each saw. Exit status 1 when any answer of the
platform was a 5xx, a connection failure or a timeout (60 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from runtime.launcher import RayJobStatus

ROOT = Path(__file__).resolve().parents[1]
#: Ray's statuses of a job that has ended.
RAY_ENDED = frozenset(s for s in RayJobStatus if s.is_terminal())
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
#: The scenarios `--scenarios` may pick (all by default), in the order they run.
SCENARIOS = ("validate-closed", "submit-open", "submit-closed", "list-closed", "ray")
PG_URL = os.environ.get("RELAX_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
REDIS_URL = "redis://127.0.0.1:6379/9"  # tests use 15 (and 14, … under xdist)
EXAMPLES = (
    "sft-arith.yaml",
    "grpo-arith.yaml",
    "ppo-arith.yaml",
    "sft-chat.yaml",
    "grpo-chat.yaml",
    "grpo-arith-megatron.yaml",
)
TEAMS = ("vision", "nlp", "rl")
POOLS = {"h200": 16, "a100": 8}  # pool -> nodes of 8 GPUs
Pass = tuple[int, int, float, float]  # jobs, queued, wall ms, CPU ms of the pass's thread
PASS_LINE = re.compile(r"scheduling pass: jobs=(\d+) queued=(\d+) ms=([\d.]+)(?: cpu_ms=([\d.]+))?")


# ---- a small HTTP/1.1 client ------------------------------------------------------------------------------
REQUEST_TIMEOUT = (
    60.0  # seconds; a request unanswered by then counts as status "timeout" (its connection is dropped)
)
TIMEOUT = -1


class Connection:
    """One keep-alive connection; `request` sends pre-serialized bytes and returns (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._request(data), REQUEST_TIMEOUT)
        except TimeoutError:
            self.close()
            return TIMEOUT, b"no answer in time"

    async def _request(self, data: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        try:
            self.writer.write(data)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            i = lower.find(b"content-length:")
            if i >= 0:
                n = int(lower[i + 15 : lower.index(b"\r\n", i)])
                body = await self.reader.readexactly(n) if n else b""
            elif b"transfer-encoding: chunked" in lower:
                chunks = []
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await self.reader.readexactly(size + 2)
                    if not size:
                        break
                    chunks.append(chunk[:-2])
                body = b"".join(chunks)
            else:
                body = b""
            if b"connection: close" in lower:
                self.close()
            return status, body
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def http_request(
    method: str, path: str, host: str, *, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Template:
    """A request whose body holds `@N@` where each send puts its sequence number (names, idempotency keys)."""

    tag: str
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""

    def render(self, host: str, n: int) -> bytes:
        body = self.body.replace(b"@N@", str(n).encode())
        headers = {k: v.replace("@N@", str(n)) for k, v in self.headers.items()}
        return http_request(self.method, self.path, host, body=body, headers=headers)


# ---- scenarios ----------------------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: str
    load: str
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)  # share of one core, per process group
    passes: list[Pass] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: dict[int, bytes] = field(default_factory=dict)  # the first body of each status that is an error

    def record(self, status: int, body: bytes, latency: float) -> None:
        self.latencies.append(latency)
        self.statuses[status] += 1
        if not 200 <= status < 300 and status not in self.samples:
            self.samples[status] = body[:600]

    def row(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000) if lat else (lambda p: float("nan"))
        errors = {s: n for s, n in sorted(self.statuses.items()) if not 200 <= s < 300}
        return {
            "scenario": self.scenario,
            "load": self.load,
            "requests": len(lat),
            "rate": len(lat) / self.wall if self.wall else 0.0,
            "p50": q(0.50),
            "p95": q(0.95),
            "p99": q(0.99),
            "max": lat[-1] * 1000 if lat else float("nan"),
            "errors": errors,
            "cpu": self.cpu,
            "passes": pass_summary(self.passes),
        }


async def closed_loop(
    host: str,
    port: int,
    pick: Callable[[int], bytes],
    clients: int,
    duration: float,
    result: Result,
    max_requests: int | None = None,
) -> None:
    seq = iter(range(1 << 62))
    sent = 0
    end = time.perf_counter() + duration

    async def client() -> None:
        nonlocal sent
        conn = Connection(host, port)
        while time.perf_counter() < end and (max_requests is None or sent < max_requests):
            sent += 1
            data = pick(next(seq))
            t0 = time.perf_counter()
            try:
                status, body = await conn.request(data)
            except (OSError, asyncio.IncompleteReadError, ValueError) as err:
                status, body = 0, repr(err).encode()  # a connection failure
            result.record(status, body, time.perf_counter() - t0)
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    result.wall = time.perf_counter() - t0


async def open_loop(
    host: str,
    port: int,
    pick: Callable[[int], bytes],
    rate: float,
    duration: float,
    result: Result,
    connections: int,
    max_requests: int | None = None,
    on_body: Callable[[int, int, bytes], None] | None = None,
) -> None:
    """A request every 1/rate s whether or not earlier ones were answered; at most `connections` at once
    (one would wait for a free connection, and that wait counts in its latency)."""
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(Connection(host, port))
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int, due: float) -> None:
        conn = await pool.get()
        try:
            status, body = await conn.request(pick(n))
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            status, body = 0, repr(err).encode()
        finally:
            pool.put_nowait(conn)
        result.record(status, body, time.perf_counter() - due)
        if on_body is not None:
            on_body(n, status, body)

    total = int(rate * duration)
    if max_requests is not None:
        total = min(total, max_requests)
    start = time.perf_counter()
    for n in range(total):
        due = start + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(n, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    result.wall = time.perf_counter() - start
    while not pool.empty():
        pool.get_nowait().close()


# ---- what the clients send ----------------------------------------------------------------------------------
def _rewrite_inputs(spec: dict[str, Any]) -> dict[str, Any]:
    """The examples start GRPO/PPO from a succeeded SFT job's export (job://sft-…/hf); here from a folder."""
    out = dict(spec)
    for k in ("hf-checkpoint", "ref-load"):
        if isinstance(out.get(k), str) and out[k].startswith("job://"):
            out[k] = "artifacts://models/tiny-sft"
    return out


def _as_args(spec: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for k, v in spec.items():
        if v is True:
            argv.append(f"--{k}")
        elif v is False or v is None:
            continue
        elif isinstance(v, list):
            argv += [f"--{k}", *map(str, v)]
        elif isinstance(v, dict):
            argv += [f"--{k}", json.dumps(v)]
        else:
            argv += [f"--{k}", str(v)]
    return argv


@dataclass
class Team:
    name: str
    id: str
    key: str
    area: Path
    queues: list[str]


def submission_templates(teams: list[Team], rng: random.Random, count: int = 240) -> list[Template]:
    examples = [yaml.safe_load((ROOT / "examples" / e).read_text()) for e in EXAMPLES]
    out = []
    for i in range(count):
        team = teams[i % len(teams)]
        ex = examples[rng.randrange(len(examples))]
        spec = _rewrite_inputs(ex["spec"])
        spec["seed"] = rng.randrange(1, 100_000)
        spec["lr"] = rng.choice([1e-4, 5e-4, 1e-3, 2e-3, 3e-3])
        if "min-lr" in spec:
            spec["min-lr"] = spec["lr"] / 10
        if spec["train-backend"] == "megatron":  # bigger jobs: tensor parallel over 2, 4 or 8 GPUs
            size = rng.choice([2, 4, 8])
            spec["tensor-model-parallel-size"] = size
            spec["resource"] = {"actor": [1, size], "rollout": [1, size]}
        if rng.random() < 0.3:
            spec.pop("eval-interval", None), spec.pop("eval-prompt-data", None)
        body: dict[str, Any] = {
            "name": f"{ex['name']}-@N@" if rng.random() < 0.7 else ex["name"],
            "queue": rng.choice(team.queues),
            "labels": {
                "project": rng.choice(["math", "chat", "agents"]),
                "owner": f"user{rng.randrange(20)}",
            },
        }
        if rng.random() < 0.2:
            body["priority_class"] = rng.choice(["low", "normal", "urgent"])
        if rng.random() < 0.35:  # Relax CLI flags, as users paste them (a few as one shell string)
            argv = _as_args(spec)
            body["args"] = " ".join(map(_shell_quote, argv)) if rng.random() < 0.3 else argv
        else:
            body["spec"] = spec
        headers = {"Authorization": f"Bearer {team.key}"}
        if rng.random() < 0.25:
            # one in 50 of these repeats a key sent before (answered 200 with the first job)
            headers["Idempotency-Key"] = (
                f"ci-{team.name}-{i}" if rng.random() < 0.02 else f"ci-{team.name}-@N@"
            )
        out.append(Template("submit", "POST", "/v1/jobs", headers, json.dumps(body).encode()))
    return out


def _shell_quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def validation_templates(teams: list[Team], rng: random.Random) -> list[Template]:
    subs = submission_templates(teams, rng, count=60)
    out = []
    for i, t in enumerate(subs):
        body = json.loads(t.body.replace(b"@N@", b"0"))
        req = {k: body[k] for k in ("spec", "args", "queue") if k in body}
        if i % 8 == 0 and "spec" in req:  # a mistake: a misspelt flag, a bad value
            req["spec"] = dict(req["spec"], **{"rollout-batch-sise": 8, "eps-clip": "wide"})
        headers = {"Authorization": t.headers["Authorization"]}
        out.append(Template("validate", "POST", "/v1/specs/validate", headers, json.dumps(req).encode()))
    return out


def list_templates(teams: list[Team], admin: str, rng: random.Random) -> list[Template]:
    out = []
    for team in teams:
        auth = {"Authorization": f"Bearer {team.key}"}
        for q in (
            "?limit=50",
            "?status=QUEUED&limit=50",
            f"?queue={team.queues[0]}&limit=20",
            "?name=sft-arith",
            "?status=QUEUED,ADMITTED&limit=100",
            "?limit=10&after=job_zzzz",
        ):
            out.append(Template("list", "GET", "/v1/jobs" + q, auth))
    out.append(Template("list", "GET", "/v1/jobs?limit=50", {"Authorization": f"Bearer {admin}"}))
    rng.shuffle(out)
    return out


# ---- the stack ----------------------------------------------------------------------------------------------
@dataclass
class Stack:
    home: Path
    schema: str
    api_port: int
    admin: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ray_address: str | None = None
    ray_token: str | None = None
    ray_temp: Path | None = None
    children: Any = None

    @property
    def scheduler_log(self) -> Path:
        return self.home / "scheduler.log"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_engine():  # type: ignore[no-untyped-def]
    import sqlalchemy as sa

    return sa.create_engine(PG_URL)


def _checkpoint(engine: Any) -> None:
    """A CHECKPOINT before the run, where the role may ask for one: what an earlier run left dirty (its rows, the
    schema it dropped) is written now, not by the server's checkpointer in the middle of a measured scenario."""
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            conn.execute(sa.text("CHECKPOINT"))
    except sa.exc.DBAPIError as e:  # not a superuser nor pg_checkpoint: measured as the server stands
        print(f"no CHECKPOINT before the run ({type(e.orig).__name__})", file=sys.stderr, flush=True)


def start_stack(home: Path, api_workers: int, with_ray: bool) -> Stack:
    import redis
    import sqlalchemy as sa

    schema = f"relax_load_{os.getpid()}_{secrets.token_hex(3)}"
    engine = _pg_engine()
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    _checkpoint(engine)
    engine.dispose()
    redis.Redis.from_url(REDIS_URL).flushdb()
    sep = "&" if "?" in PG_URL else "?"
    stack = Stack(home=home, schema=schema, api_port=_free_port(), admin="rlx_" + secrets.token_urlsafe(24))
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RELAX_ENVIRONMENT": "production",
        "RELAX_DATABASE_URL": f"{PG_URL}{sep}options=-csearch_path%3D{schema}",
        "RELAX_BROKER_URL": REDIS_URL,
        "RELAX_SECRET_KEY": secrets.token_hex(16),
        "RELAX_HOME": str(home),
        "RELAX_HOST": "127.0.0.1",
        "RELAX_PORT": str(stack.api_port),
        "RELAX_API_WORKERS": str(api_workers),
        "RELAX_BOOTSTRAP_ADMIN_KEY": stack.admin,
    }
    if with_ray:  # first: it takes longest to come up
        from api.embedded import Children, ray_temp_dir, start_ray
        from scheduler.settings import RaySettings, Settings

        settings = Settings(home=home / "ray-home", ray=RaySettings(num_cpus=2))
        stack.children = Children(home / "ray-logs")
        stack.ray_address = start_ray(stack.children, settings, "bench")
        stack.ray_token = settings.ray_token("bench")
        stack.ray_temp = ray_temp_dir(settings)
    for role in ("api", "scheduler"):
        stack.procs[role] = subprocess.Popen(
            ["sh", str(ENTRYPOINT), role],
            cwd=ROOT,
            env=env,
            stdout=open(home / f"{role}.log", "wb"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if role == "api":  # the API role migrates first; the scheduler waits for it
            _wait_ready(stack, need_worker=False)
    _wait_ready(stack, need_worker=True)
    return stack


def _wait_ready(stack: Stack, need_worker: bool, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    body = ""
    while time.time() < deadline:
        for role, p in stack.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{role} exited: {(stack.home / f'{role}.log').read_text()[-3000:]}")
        try:
            body = (
                urllib.request.urlopen(f"http://127.0.0.1:{stack.api_port}/readyz", timeout=3).read().decode()
            )
            if not need_worker or '"status":"ready"' in body:
                return
        except urllib.error.HTTPError as err:
            body = err.read().decode()
            if not need_worker:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the platform is not ready after {timeout:.0f} s: {body}")


def stop_stack(stack: Stack, keep: bool) -> None:
    import redis
    import sqlalchemy as sa

    for p in stack.procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in stack.procs.values():
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    if stack.children is not None:
        from api.embedded import stop_ray_of

        stack.children.stop()
        if stack.ray_temp is not None:
            stop_ray_of(stack.ray_temp)
            shutil.rmtree(stack.ray_temp, ignore_errors=True)
    if not keep:
        engine = _pg_engine()
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{stack.schema}" CASCADE'))
        engine.dispose()
        redis.Redis.from_url(REDIS_URL).flushdb()


def _call(stack: Stack, method: str, path: str, key: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{stack.api_port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        return json.loads(urllib.request.urlopen(req, timeout=30).read() or b"null")
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{method} {path}: {err.code} {err.read()[:500]!r}") from None


def pool_body(pool: str, nodes: int) -> dict[str, Any]:
    """The admin API's body for one of the benchmark's pools: `nodes` 8-GPU nodes, four to a rack."""
    return {
        "name": pool,
        "accelerator": pool,
        "nodes": [
            {"name": f"{pool}-{i:02d}", "gpus": 8, "labels": {"rack": str(i // 4)}} for i in range(nodes)
        ],
    }


def set_up(stack: Stack) -> list[Team]:
    """Teams, keys, pools with nodes, queues, and the examples' inputs in each team's area."""
    a = stack.admin
    for pool, nodes in POOLS.items():
        _call(stack, "POST", "/v1/pools", a, pool_body(pool, nodes))
    teams = []
    for name in TEAMS:
        team = _call(stack, "POST", "/v1/teams", a, {"name": name})
        key = _call(stack, "POST", "/v1/api-keys", a, {"name": f"{name}-ci", "role": "member", "team": name})[
            "key"
        ]
        queues = []
        for pool, nodes in POOLS.items():
            q = f"{name}-{pool}"
            _call(
                stack,
                "POST",
                "/v1/queues",
                a,
                {"name": q, "pool": pool, "team": name, "nominal_gpus": nodes * 8 // 3},
            )
            queues.append(q)
        area = Path(_call(stack, "GET", "/v1/storage", key)["area"])
        for d in ("models/tiny", "models/tiny-sft", "datasets/arith"):
            (area / d).mkdir(parents=True, exist_ok=True)
        for f in ("train.jsonl", "test.jsonl", "sft.jsonl", "sft_chat.jsonl"):
            (area / "datasets/arith" / f).write_text('{"input": "1+1=", "label": "2"}\n')
        teams.append(Team(name, team["id"], key, area, queues))
    # `low` and `normal` exist; `high` is not preemptible (by grant only): a preemptible class above normal
    _call(stack, "POST", "/v1/priority-classes", a, {"name": "urgent", "value": 50, "preemptible": True})
    return teams


# ---- measurements -------------------------------------------------------------------------------------------
def platform_processes(stack: Stack) -> dict[str, list[psutil.Process]]:
    """Every process of each part, by part: the API (uvicorn's parent and workers), the scheduler (worker and
    beat), Ray (its daemons), PostgreSQL (its backends), this load generator."""
    groups: dict[str, list[psutil.Process]] = {}
    for role, p in stack.procs.items():
        try:
            root = psutil.Process(p.pid)
            groups[role] = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            groups[role] = []
    if stack.ray_temp is not None:
        from api.embedded import ray_processes

        groups["ray"] = ray_processes(stack.ray_temp)
    groups["postgres"] = [
        p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")
    ]
    groups["loadgen"] = [psutil.Process()]
    return groups


class CpuMeter:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.start = self._read()
        self.t0 = time.perf_counter()

    def _read(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for group, procs in platform_processes(self.stack).items():
            for p in procs:
                try:
                    t = p.cpu_times()
                    out.setdefault(group, {})[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
        return out

    def shares(self) -> dict[str, float]:
        end, wall = self._read(), time.perf_counter() - self.t0
        return {
            g: round(sum(v - self.start.get(g, {}).get(pid, 0.0) for pid, v in pids.items()) / wall, 3)
            for g, pids in end.items()
        }


def read_passes(stack: Stack, offset: int) -> tuple[list[Pass], int]:
    try:
        with open(stack.scheduler_log, "rb") as f:
            f.seek(offset)
            text = f.read()
    except FileNotFoundError:
        return [], offset
    found = [
        (int(m[1]), int(m[2]), float(m[3]), float(m[4]) if m[4] else float("nan"))
        for m in PASS_LINE.finditer(text.decode(errors="replace"))
    ]
    return found, offset + len(text)


def pass_summary(passes: list[Pass]) -> dict[str, Any] | None:
    """Wall time of the passes, and the CPU time of each (the part not spent waiting for a CPU or the
    database): on a busy machine the wall time mostly measures the machine."""
    if not passes:
        return None
    ms = sorted(p[2] for p in passes)
    cpu = sorted(p[3] for p in passes)
    at_2000 = [p for p in passes if p[1] <= 2000]
    return {
        "passes": len(ms),
        "queued_max": max(p[1] for p in passes),
        "jobs_max": max(p[0] for p in passes),
        "p50_ms": round(statistics.median(ms), 1),
        "max_ms": round(ms[-1], 1),
        "cpu_p50_ms": round(statistics.median(cpu), 1),
        "cpu_max_ms": round(cpu[-1], 1),
        "max_ms_at_2000": max((p[2] for p in at_2000), default=None),
        "cpu_max_ms_at_2000": max((p[3] for p in at_2000), default=None),
    }


def memory(stack: Stack) -> dict[str, tuple[float, float]]:
    """RSS and PSS (MiB) of every process, named part:pid:name."""
    out = {}
    for group, procs in platform_processes(stack).items():
        if group == "postgres":
            continue
        for p in procs:
            try:
                m = p.memory_full_info()
                out[f"{group}:{p.pid}:{p.name()[:20]}"] = (m.rss / 2**20, getattr(m, "pss", m.rss) / 2**20)
            except psutil.Error:
                pass
    return out


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600 if den else float("nan")


# ---- the run ------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, stack: Stack, teams: list[Team], args: argparse.Namespace) -> None:
        self.stack, self.teams, self.args = stack, teams, args
        self.host = f"127.0.0.1:{stack.api_port}"
        rng = random.Random(args.seed)
        self.submits = submission_templates(teams, rng)
        self.validations = validation_templates(teams, rng)
        self.lists = list_templates(teams, stack.admin, rng)
        self.results: list[Result] = []
        self.log_offset = 0
        self.job_seq = 0  # submissions' sequence numbers never repeat across scenarios

    def submit_pick(self, n: int) -> bytes:
        self.job_seq += 1
        return self.submits[n % len(self.submits)].render(self.host, self.job_seq)

    def measure(self, scenario: str, load: str, run: Callable[[Result], Any]) -> Result:
        result = Result(scenario, load)
        _, self.log_offset = read_passes(self.stack, self.log_offset)
        cpu = CpuMeter(self.stack)
        asyncio.run(run(result))
        result.cpu = cpu.shares()
        time.sleep(0.5)  # the passes the last requests asked for
        result.passes, self.log_offset = read_passes(self.stack, self.log_offset)
        self.results.append(result)
        print(_format_row(result.row()), file=sys.stderr, flush=True)
        for status, body in result.samples.items():
            print(
                f"  first {status or 'connection failure'}: {body.decode(errors='replace')}", file=sys.stderr
            )
        return result

    def run(self) -> None:
        a, port = self.args, self.stack.api_port
        host = "127.0.0.1"
        only = set(a.scenarios)
        pick_v = lambda n: self.validations[n % len(self.validations)].render(self.host, n)  # noqa: E731
        pick_l = lambda n: self.lists[n % len(self.lists)].render(self.host, n)  # noqa: E731
        # warm-up (imports, connection pools, caches): not measured
        asyncio.run(closed_loop(host, port, pick_v, 4, 2.0, Result("warm", "")))
        asyncio.run(closed_loop(host, port, self.submit_pick, 4, 1.0, Result("warm", "")))
        if "validate-closed" in only:
            self.measure(
                "validate closed",
                f"{a.clients} clients",
                lambda r: closed_loop(host, port, pick_v, a.clients, a.duration, r),
            )
        if "submit-open" in only:
            self.measure(
                "submit open",
                f"{a.rate:g}/s",
                lambda r: open_loop(host, port, self.submit_pick, a.rate, a.duration, r, a.clients),
            )
            self.measure("hold (passes only)", "0", lambda r: _idle(10.0, r))
        if "submit-closed" in only:
            self.measure(
                "submit closed",
                f"{a.clients} clients",
                lambda r: closed_loop(host, port, self.submit_pick, a.clients, a.duration, r),
            )
        if "list-closed" in only:
            self.measure(
                "list closed",
                f"{a.clients} clients",
                lambda r: closed_loop(host, port, pick_l, a.clients, a.duration, r),
            )
        if self.stack.ray_address and "ray" in only:
            self.run_ray()
        if a.soak:
            self.soak(a.soak)

    def run_ray(self) -> None:
        a = self.args
        host, _, port_s = self.stack.ray_address.removeprefix("http://").partition(":")
        port = int(port_s)
        auth = {"Authorization": f"Bearer {self.stack.ray_token}"}
        hostport = f"{host}:{port}"
        rng = random.Random(a.seed)

        def pick_submit(n: int) -> bytes:
            body = {
                "entrypoint": "true",
                "metadata": {"team": rng.choice(TEAMS), "n": str(n)},
                "runtime_env": {"env_vars": {"SEED": str(rng.randrange(100_000))}},
            }
            return http_request("POST", "/api/jobs/", hostport, body=json.dumps(body).encode(), headers=auth)

        list_req = http_request("GET", "/api/jobs/", hostport, headers=auth)
        self.measure(
            "ray submit closed",
            f"{a.clients} clients",
            lambda r: closed_loop(host, port, pick_submit, a.clients, a.duration, r, a.ray_max_requests),
        )
        self._ray_settle()
        self.measure(
            "ray submit open",
            f"{a.rate:g}/s",
            lambda r: open_loop(
                host, port, pick_submit, a.rate, a.duration, r, a.clients, a.ray_max_requests
            ),
        )
        self._ray_settle()
        self.measure(
            "ray list closed",
            f"{a.clients} clients",
            lambda r: closed_loop(host, port, lambda n: list_req, a.clients, min(a.duration, 10.0), r),
        )

    def _ray_settle(self, timeout: float = 120) -> None:
        """Wait for Ray's jobs to end (each runs `true` under a supervisor actor), so the next scenario starts
        from a quiet machine."""
        deadline = time.time() + timeout
        req = urllib.request.Request(
            f"{self.stack.ray_address}/api/jobs/", headers={"Authorization": f"Bearer {self.stack.ray_token}"}
        )
        while time.time() < deadline:
            jobs = json.loads(urllib.request.urlopen(req, timeout=60).read())
            if all(j.get("status") in RAY_ENDED for j in jobs):
                return
            time.sleep(2)

    def soak(self, seconds: float) -> None:
        """The open-loop mix, with every process's memory sampled every `--sample` s."""
        a = self.args
        host, port = "127.0.0.1", self.stack.api_port
        mine: dict[str, list[str]] = {t.name: [] for t in self.teams}  # each team's jobs created in the soak

        def pick(n: int) -> bytes:
            r = n % 20
            if r < 6:
                return self.submit_pick(n)
            team = self.teams[n % len(self.teams)]
            if r >= 14 and mine[team.name]:  # cancel the team's oldest job of the soak
                return http_request(
                    "POST",
                    f"/v1/jobs/{mine[team.name].pop(0)}/cancel",
                    self.host,
                    headers={"Authorization": f"Bearer {team.key}"},
                )
            if r < 11 or r >= 14:  # (a list instead of a cancel while the team has no job to cancel)
                return self.lists[n % len(self.lists)].render(self.host, n)
            return self.validations[n % len(self.validations)].render(self.host, n)

        def on_body(n: int, status: int, body: bytes) -> None:
            if status == 201:
                doc = json.loads(body)
                team = next(t for t in self.teams if t.id == doc["team_id"])
                mine[team.name].append(doc["id"])

        samples: dict[str, list[tuple[float, float, float]]] = {}
        stop = False

        async def sampler() -> None:
            t0 = time.perf_counter()
            while not stop:
                now = time.perf_counter() - t0
                for name, (rss, pss) in (await asyncio.to_thread(memory, self.stack)).items():
                    samples.setdefault(name, []).append((now, rss, pss))
                await asyncio.sleep(a.sample)

        async def run(r: Result) -> None:
            nonlocal stop
            task = asyncio.create_task(sampler())
            await open_loop(host, port, pick, a.rate, seconds, r, a.clients, on_body=on_body)
            stop = True
            await task

        result = self.measure("soak (mix)", f"{a.rate:g}/s", run)
        half = seconds / 2
        for name, pts in sorted(samples.items()):
            late = [p for p in pts if p[0] >= half]
            result.notes.append(
                f"{name:<40} rss {pts[0][1]:7.1f} -> {pts[-1][1]:7.1f} MiB, slope {slope_per_hour([(t, r) for t, r, _ in late]):+8.1f} MiB/h; "
                f"pss {pts[0][2]:7.1f} -> {pts[-1][2]:7.1f} MiB, slope {slope_per_hour([(t, p) for t, _, p in late]):+8.1f} MiB/h"
            )


async def _idle(seconds: float, result: Result) -> None:
    await asyncio.sleep(seconds)
    result.wall = seconds


def _format_row(row: dict[str, Any]) -> str:
    names = {0: "conn", TIMEOUT: "timeout"}
    errors = " ".join(f"{names.get(s, s)}:{n}" for s, n in row["errors"].items()) or "-"
    return (
        f"{row['scenario']:<20} {row['load']:>11} {row['requests']:>8} {row['rate']:>8.1f} "
        f"{row['p50']:>7.1f} {row['p95']:>7.1f} {row['p99']:>7.1f} {row['max']:>8.1f}  {errors}"
    )


def print_report(bench: Bench, wall: float, cpu0: float) -> None:
    header = (
        f"{'scenario':<20} {'clients/rate':>11} {'requests':>8} {'rate/s':>8} "
        f"{'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>8}  errors by status"
    )
    print(header)
    print("-" * len(header))
    rows = [r.row() for r in bench.results]
    for row in rows:
        print(_format_row(row))
    print(
        "\nCPU while each ran, in cores (1.0 = one core busy) and in ms per request (what sets the rate a"
        " machine can reach, whatever else runs on it), and the scheduling passes it saw:"
    )
    for row in rows:
        rate = row["rate"]
        cpu = ", ".join(
            f"{k} {v:.2f}" + (f" ({v * 1000 / rate:.1f} ms/req)" if rate else "")
            for k, v in row["cpu"].items()
        )
        p = row["passes"]
        passes = (
            f"passes {p['passes']}, queued <= {p['queued_max']}: wall p50 {p['p50_ms']} max {p['max_ms']} ms,"
            f" CPU p50 {p['cpu_p50_ms']} max {p['cpu_max_ms']} ms (with <= 2000 queued: max wall"
            f" {p['max_ms_at_2000']}, CPU {p['cpu_max_ms_at_2000']} ms)"
            if p
            else "no pass"
        )
        print(f"  {row['scenario']:<20} {cpu}; {passes}")
    for r in bench.results:
        if r.notes:
            print(f"\n{r.scenario}: memory of every process (slope over the second half)")
            for line in r.notes:
                print("  " + line)
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"\nload generator: {own.ru_utime + own.ru_stime - cpu0:.1f} s CPU over {wall:.0f} s "
        f"({(own.ru_utime + own.ru_stime - cpu0) / wall:.1%} of one core); machine load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end, {os.cpu_count()} cores"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.api_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per scenario (default 20)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=100.0, help="open-loop requests per second (default 100)")
    ap.add_argument(
        "--soak", type=float, default=0.0, metavar="SECONDS", help="then the mixed soak this long"
    )
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples in the soak")
    ap.add_argument("--api-workers", type=int, default=2, help="RELAX_API_WORKERS (default 2)")
    ap.add_argument(
        "--ray-max-requests",
        type=int,
        default=400,
        help="bound on Ray job submissions per scenario (each starts a process)",
    )
    ap.add_argument("--no-ray", action="store_true", help="leave out Ray's job REST API")
    ap.add_argument(
        "--scenarios",
        type=lambda v: [x for x in v.split(",") if x],
        default=list(SCENARIOS),
        help=f"comma-separated, run in this order: {','.join(SCENARIOS)} (default all; submit-open is followed "
        "by the hold)",
    )
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--keep", action="store_true", help="keep the home, the schema and Redis db 9 afterwards")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        ap.error(f"--scenarios: unknown {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")

    home = Path(tempfile.mkdtemp(prefix="relax-load-"))
    print(f"home {home}; load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    stack = start_stack(home, args.api_workers, with_ray=not args.no_ray)
    cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    t0 = time.perf_counter()
    try:
        teams = set_up(stack)
        bench = Bench(stack, teams, args)
        bench.run()
    finally:
        wall = time.perf_counter() - t0
        stop_stack(stack, keep=args.keep)
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps([r.row() | {"notes": r.notes} for r in bench.results], indent=1, default=str))
    else:
        print_report(bench, wall, cpu0)
    # the platform's answers only: Ray's dashboard timing out is a finding about Ray, not a failure here
    bad = sum(
        n
        for r in bench.results
        if not r.scenario.startswith("ray ")
        for s, n in r.statuses.items()
        if s <= 0 or s >= 500
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
