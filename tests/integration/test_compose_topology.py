"""compose.yaml's platform as local processes (no Docker engine runs here): its services' commands (the roles of
docker/entrypoint.sh) with its environment, pointed at the local PostgreSQL (a schema of this test) and Redis
instead of its containers: the migration, two API replicas, two schedulers (beat + pass worker each), the pool's
worker and the pool's registration. Jobs submitted concurrently through both APIs are admitted by passes of both
schedulers, and no node's slot is ever held by two jobs: the database itself keeps the ledger (triggers of this
test on `allocations`, in commit order) and the log of passes (on the pass lock's row: lock taken -> commit).
No Ray here: the pool's Ray address is a closed port, so each launch fails at once and frees its slots, which
the next pass hands to the next job (many passes that admit, the race that matters). Heavy: three Celery workers
(tests/conftest.py::HEAVY_LANES)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa

from api.app import WEB_DIST
from tests.compose_spec import ENTRYPOINT, ROOT, environment, image_env, load, read_env_file
from tests.conftest import REDIS_URL, _drop_schema, _postgres_schema_url
from tests.factories import grpo_spec, seed_area

ADMIN_KEY = "rlx_compose-topology-test-admin-key"
NODES = {"ray-head": 3, "ray-worker": 5}  # slots: 8 in all
JOBS = 40
CLOSED_PORT = "http://127.0.0.1:9"  # the pool's Ray: nothing listens there


# The ledger and the pass log: PL/pgSQL triggers in this test's schema (dropped with it).
INSTRUMENTS = """
CREATE TABLE t_node_usage (pool text, node text, used int NOT NULL, peak int NOT NULL, PRIMARY KEY (pool, node));
CREATE TABLE t_overbooked (pool text, node text, used int, capacity int, job_id text);
CREATE FUNCTION t_ledger_add(p text, n text, g int, job text) RETURNS void AS $$
DECLARE u int; cap int;
BEGIN
  -- one row per node, updated in place: writers queue on the rows' locks and each sees the sums as the writers
  -- before it committed them (READ COMMITTED re-reads a locked row), so this is the usage in commit order. The
  -- pool's rows are locked together, in one order (no deadlock between a pass and a job that frees two nodes)
  PERFORM 1 FROM t_node_usage WHERE pool = p ORDER BY node FOR UPDATE;
  UPDATE t_node_usage SET used = used + g, peak = GREATEST(peak, used + g) WHERE pool = p AND node = n
    RETURNING used INTO u;
  SELECT gpus INTO cap FROM nodes WHERE pool = p AND name = n;
  IF g > 0 AND u > cap THEN INSERT INTO t_overbooked VALUES (p, n, u, cap, job); END IF;
END $$ LANGUAGE plpgsql;
CREATE FUNCTION t_ledger() RETURNS trigger AS $$
BEGIN
  IF TG_OP IN ('DELETE', 'UPDATE') AND NOT OLD.shared THEN
    PERFORM t_ledger_add(OLD.pool, OLD.node, -OLD.gpus, OLD.job_id);
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') AND NOT NEW.shared THEN
    PERFORM t_ledger_add(NEW.pool, NEW.node, NEW.gpus, NEW.job_id);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER t_ledger AFTER INSERT OR UPDATE OR DELETE ON allocations FOR EACH ROW EXECUTE FUNCTION t_ledger();

CREATE TABLE t_passes (txid bigint PRIMARY KEY, holder text, started timestamptz, ended timestamptz);
-- a BEFORE ROW trigger fires once the row is locked: when the pass holds the lock
CREATE FUNCTION t_pass_start() RETURNS trigger AS $$
BEGIN
  INSERT INTO t_passes VALUES (txid_current(), NEW.holder, clock_timestamp(), NULL) ON CONFLICT DO NOTHING;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER t_pass_start BEFORE UPDATE ON scheduler_locks FOR EACH ROW WHEN (NEW.name = 'pass')
  EXECUTE FUNCTION t_pass_start();
-- a deferred constraint trigger fires at COMMIT, just before the lock is let go
CREATE FUNCTION t_pass_end() RETURNS trigger AS $$
BEGIN
  UPDATE t_passes SET ended = clock_timestamp() WHERE txid = txid_current();
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE CONSTRAINT TRIGGER t_pass_end AFTER UPDATE ON scheduler_locks DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.name = 'pass') EXECUTE FUNCTION t_pass_end();
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Topology:
    """compose.yaml's services as processes on this machine."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.tmp, self.db_url = tmp, db_url
        self.home = tmp / "relax-home"  # the shared volume `relax-home`
        self.home.mkdir()
        self.compose = load(
            read_env_file()
            | {
                "RELAX_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
                "RELAX_API_WORKERS": "1",  # two cores here
                "RELAX_LOG_FORMAT": "text",
                "RELAX_POOL_NODES": ",".join(f"{n}={s}" for n, s in NODES.items()),
            }
        )
        self.services: dict[str, Any] = self.compose["services"]
        self.ports = {name: _free_port() for name in ("api-1", "api-2")}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def url(self, api: str) -> str:
        return f"http://127.0.0.1:{self.ports[api]}"

    def env(self, name: str) -> dict[str, str]:
        """The service's environment, its container addresses mapped to this machine's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAX_")}
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        hosts = {"http://proxy:8400": self.url("api-1"), "http://api-1:8400": self.url("api-1")}
        hosts |= {"http://api-2:8400": self.url("api-2"), "http://ray-head:8265": CLOSED_PORT}
        service = self.services[name]
        # the image's ENV, then the service's environment
        for key, value in (image_env(service["build"]["target"]) | environment(service)).items():
            if key == "RELAX_DATABASE_URL":
                assert "@postgres:5432/" in value, value
                value = self.db_url
            elif key == "RELAX_BROKER_URL":
                assert value.startswith("redis://redis:6379/"), value
                value = REDIS_URL
            elif value.startswith("/tmp/"):  # a container's own file
                value = str(self.tmp / name / Path(value).name)
                Path(value).parent.mkdir(exist_ok=True)
            value = value.replace("/var/lib/relax", str(self.home))
            env[key] = hosts.get(value, value)
        if name in self.ports:  # both replicas listen on 8400, each in its container
            env |= {"RELAX_HOST": "127.0.0.1", "RELAX_PORT": str(self.ports[name])}
        return env

    def start(self, name: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), *self.services[name]["command"]],
            cwd=ROOT,
            env=self.env(name),
            stdout=open(self.tmp / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def run(self, name: str, timeout: float = 60) -> None:
        """A one-shot service (`restart: "no"`), to its end."""
        assert self.services[name]["restart"] == "no"
        rc = self.start(name).wait(timeout)
        assert rc == 0, self.log(name)

    def log(self, name: str) -> str:
        return f"--- {name}:\n" + (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(5)


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    url, schema = _postgres_schema_url()
    redis.Redis.from_url(REDIS_URL).flushdb()  # this worker's own database (tests/conftest.py::REDIS_URL)
    top = Topology(tmp_path, url)
    try:
        yield top
    finally:
        top.stop()
        _drop_schema(schema)


def _wait_healthy(top: Topology, name: str, deadline: float) -> None:
    while time.time() < deadline:
        assert top.procs[name].poll() is None, top.log(name)
        try:
            if httpx.get(top.url(name) + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(top.log(name))


def test_two_apis_and_two_schedulers_never_double_book(topology: Topology) -> None:
    top, t0 = topology, time.time()
    # compose's order: the one-shot migration, then the control plane, then the pool's registration
    top.run("migrate")
    engine = sa.create_engine(top.db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(INSTRUMENTS))
        team_id = conn.execute(sa.text("SELECT id FROM teams WHERE name = 'default'")).scalar_one()
    seed_area(top.home / "artifacts", team_id)  # grpo_spec()'s model and prompts (RELAX_ARTIFACT_ROOT)
    for name in ("api-1", "api-2", "scheduler-1", "scheduler-2", "worker"):
        top.start(name)
    for name in ("api-1", "api-2"):
        _wait_healthy(top, name, t0 + 150)  # ~15 s alone; 2 busy cores
    top.run("register-pool")
    with engine.connect() as conn:
        nodes = dict(conn.execute(sa.text("SELECT name, gpus FROM nodes WHERE pool = 'cluster'")).all())
        address = conn.execute(sa.text("SELECT ray_address FROM pools WHERE name = 'cluster'")).scalar_one()
    assert nodes == NODES and address == CLOSED_PORT
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO t_node_usage SELECT pool, name, 0, 0 FROM nodes"))

    # both replicas serve the dashboard (the built one where web/dist is built, as in the image)
    for api in ("api-1", "api-2"):
        page = httpx.get(top.url(api) + "/", timeout=5)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        if (WEB_DIST / "index.html").exists():
            assert page.text == (WEB_DIST / "index.html").read_text()

    # usage as any reader sees it, polled all along: never above a node's slots
    seen_over: list[tuple] = []
    stop = threading.Event()

    def poll() -> None:
        with engine.connect() as conn:
            while not stop.is_set():
                rows = conn.execute(
                    sa.text(
                        "SELECT a.node, sum(a.gpus), min(n.gpus) FROM allocations a JOIN nodes n "
                        "ON n.pool = a.pool AND n.name = a.node WHERE NOT a.shared GROUP BY a.node "
                        "HAVING sum(a.gpus) > min(n.gpus)"
                    )
                ).all()
                seen_over.extend(rows)
                conn.commit()
                time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t_submit = time.time()
    # meanwhile, the schedulers' health check as compose runs it (`$$` is `$` once interpolated)
    kind, check = top.services["scheduler-1"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    health = subprocess.Popen(
        ["sh", "-c", check],
        cwd=ROOT,
        env=top.env("scheduler-1"),
        stdout=open(top.tmp / "healthcheck.log", "wb"),
        stderr=subprocess.STDOUT,
    )

    # many jobs of 1-3 slots at once, half through each replica
    def submit(i: int) -> str:
        api = ("api-1", "api-2")[i % 2]
        # 1, 2 or 3 slots: the actor on one (the torch backend's), the rollout on its GPU or on 1-2 of its own
        k = i % 3
        spec = grpo_spec(colocate=k == 0, resource={"actor": [1, 1], "rollout": [1, max(k, 1)]})
        r = httpx.post(
            top.url(api) + "/v1/jobs",
            json={"name": f"compose-{i}", "spec": spec},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    try:
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(submit, range(JOBS)))
        # each is admitted, launched on the pool's (absent) Ray by the worker, fails there and frees its slots
        deadline = time.time() + 90
        with engine.connect() as conn:
            while time.time() < deadline:
                ended = conn.execute(
                    sa.text("SELECT count(*) FROM jobs WHERE status IN ('FAILED', 'CANCELLED', 'SUCCEEDED')")
                ).scalar_one()
                conn.commit()
                if ended == JOBS:
                    break
                time.sleep(0.3)
    finally:
        stop.set()
        poller.join(5)
    print(
        f"startup {t_submit - t0:.1f} s, {JOBS} jobs through both APIs to their ends {time.time() - t_submit:.1f} s"
    )
    logs = "\n".join(top.log(n) for n in ("scheduler-1", "scheduler-2", "worker"))
    assert ended == JOBS, logs

    with engine.connect() as conn:
        admitted = conn.execute(
            sa.text("SELECT count(DISTINCT job_id) FROM job_events WHERE to_status = 'ADMITTED'")
        ).scalar_one()
        reasons = conn.execute(sa.text("SELECT DISTINCT status_reason FROM jobs")).scalars().all()
        overbooked = conn.execute(sa.text("SELECT * FROM t_overbooked")).all()
        usage = {r.node: r for r in conn.execute(sa.text("SELECT * FROM t_node_usage")).all()}
        passes = conn.execute(
            sa.text("SELECT holder, started, ended FROM t_passes WHERE ended IS NOT NULL ORDER BY started")
        ).all()
    assert admitted == JOBS and all(CLOSED_PORT.removeprefix("http://") in r for r in reasons), reasons
    # no slot of any node held by two jobs, in commit order or as any reader saw it
    assert overbooked == [] and seen_over == []
    assert {n: u.used for n, u in usage.items()} == {n: 0 for n in NODES}  # every slot freed again
    assert {n: u.peak for n, u in usage.items()} == NODES  # and every slot was taken: the pool was full
    # passes ran one at a time, from both schedulers
    assert all(b.started >= a.ended for a, b in zip(passes, passes[1:], strict=False)), passes
    print(f"{len(passes)} passes, by holder {Counter(p.holder for p in passes)}")
    host = socket.gethostname()
    holders = {p.holder for p in passes}
    schedulers = {f"{host}:{top.procs[n].pid}" for n in ("scheduler-1", "scheduler-2")}
    assert holders == schedulers, (holders, schedulers)
    assert health.wait(60) == 0, (top.tmp / "healthcheck.log").read_text()
    # and either replica finds the platform ready: database, broker, the schedulers' and the worker's heartbeats
    ready = httpx.get(top.url("api-2") + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["database"] == "postgresql", ready.text

    # the ledger is no instrument that cannot fail: a slot handed twice is caught
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO allocations (job_id, pool, node, role, replica, gpus, shared) "
                "VALUES (:a, 'cluster', 'ray-head', 'actor', 0, 2, false), "
                "(:b, 'cluster', 'ray-head', 'actor', 0, 2, false)"
            ),
            {"a": ids[0], "b": ids[1]},
        )
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT node, used, capacity FROM t_overbooked")).all() == [
            ("ray-head", 4, 3)
        ]
    engine.dispose()
