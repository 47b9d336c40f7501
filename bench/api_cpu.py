"""The API's own CPU per request, in process: submissions, validations and listings.

    python -m bench.api_cpu [--db postgresql|sqlite] [-n 300] [--warm 30] [--concurrency 1]
                            [--profile submit|validate|list] [--top 40] [--json]

Builds the app with `api.app.create_app` in this process, against a fresh schema of the local PostgreSQL
(`RELAX_TEST_POSTGRES_URL`, database `test`; dropped afterwards) or a fresh SQLite file, sets up what
`bench.api_load` sets up (3 teams with a member key each, 2 pools of 8-GPU nodes, a queue per team and pool, a
class `urgent`, the examples' inputs in each area) through the admin API, then sends the requests of
`bench.api_load` (the same templates and seed) straight to the ASGI app, `--concurrency` at a time, and
reports the process's CPU time (`time.process_time`, every thread) per request. The database server's CPU is
not in it (PostgreSQL runs in its own processes; SQLite runs in this one). No network, no uvicorn: what is
left is the application's own work, the figure `bench.api_load` reports as "API CPU per request" less
uvicorn's HTTP parsing. On PostgreSQL, when its server runs on this machine, the CPU time of the server
processes serving the app's connections (found by their `application_name`, read from /proc) is reported
beside it as `pg` (none where /proc does not show them).

`--profile SCENARIO` runs that scenario again under cProfile (one profiler per thread, merged) and prints
the top functions by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.api_load import (
    PG_URL,
    POOLS,
    TEAMS,
    Team,
    Template,
    list_templates,
    pool_body,
    submission_templates,
    validation_templates,
)


class NoDispatch:
    """The API asks for passes and launches; here nothing consumes them (the broker is not measured)."""

    def request_pass(self) -> None:
        pass

    def launch(self, job_id: str, pool: str) -> None:
        pass

    def stop(self, job_id: str, pool: str) -> None:
        pass

    def reconcile(self, pool: str) -> None:
        pass


async def asgi_call(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, bytes]:
    """One request straight to the ASGI app, as uvicorn would hand it over."""
    raw_path, _, query = path.partition("?")
    hdrs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    hdrs += [(b"host", b"127.0.0.1:8400"), (b"content-length", str(len(body)).encode())]
    if body:
        hdrs.append((b"content-type", b"application/json"))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": raw_path,
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": hdrs,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8400),
        "state": {},
    }
    done = asyncio.Event()
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    return status, b"".join(chunks)


def _template_request(t: Template, n: int) -> tuple[str, str, dict[str, str], bytes]:
    headers = {k: v.replace("@N@", str(n)) for k, v in t.headers.items()}
    return t.method, t.path, headers, t.body.replace(b"@N@", str(n).encode())


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.home = Path(tempfile.mkdtemp(prefix="relax-apicpu-"))
        self.schema: str | None = None
        self.seq = 0
        self.app_name = f"relax_apicpu_{os.getpid()}"

    # -- the platform ------------------------------------------------------------------------------------
    def database_url(self) -> str:
        from scheduler.db.migrate import upgrade

        if self.args.db == "sqlite":
            url = f"sqlite:///{self.home / 'relax.db'}"
        else:
            self.schema = f"relax_apicpu_{os.getpid()}_{secrets.token_hex(3)}"
            engine = sa.create_engine(PG_URL)
            with engine.begin() as conn:
                conn.execute(sa.text(f'CREATE SCHEMA "{self.schema}"'))
            engine.dispose()
            sep = "&" if "?" in PG_URL else "?"
            url = f"{PG_URL}{sep}options=-csearch_path%3D{self.schema}&application_name={self.app_name}"
        upgrade(url)
        return url

    def drop(self) -> None:
        if self.schema is not None:
            engine = sa.create_engine(PG_URL)
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            engine.dispose()
        shutil.rmtree(self.home, ignore_errors=True)

    def build(self) -> None:
        from api.app import create_app
        from scheduler.db.engine import Database
        from scheduler.services.platform import ensure_admin_key, ensure_team
        from scheduler.settings import DatabaseSettings, Settings

        url = self.database_url()
        settings = Settings(home=self.home, database=DatabaseSettings(url=url))
        self.db = Database(url)
        with self.db.session() as s:
            ensure_team(s, "default")
            self.admin = ensure_admin_key(s, self.home / "admin.key")
        self.app = create_app(settings, db=self.db, dispatcher=NoDispatch())

    async def call(self, method: str, path: str, key: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        status, out = await asgi_call(self.app, method, path, {"Authorization": f"Bearer {key}"}, data)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {out[:500]!r}")
        return json.loads(out or b"null")

    async def set_up(self) -> list[Team]:
        """What bench.api_load.set_up makes, through the same admin API."""
        a = self.admin
        for pool, nodes in POOLS.items():
            await self.call("POST", "/v1/pools", a, pool_body(pool, nodes))
        teams = []
        for name in TEAMS:
            team = await self.call("POST", "/v1/teams", a, {"name": name})
            created = await self.call(
                "POST", "/v1/api-keys", a, {"name": f"{name}-ci", "role": "member", "team": name}
            )
            key = created["key"]
            queues = []
            for pool, nodes in POOLS.items():
                q = f"{name}-{pool}"
                await self.call(
                    "POST",
                    "/v1/queues",
                    a,
                    {"name": q, "pool": pool, "team": name, "nominal_gpus": nodes * 8 // 3},
                )
                queues.append(q)
            area = Path((await self.call("GET", "/v1/storage", key))["area"])
            for d in ("models/tiny", "models/tiny-sft", "datasets/arith"):
                (area / d).mkdir(parents=True, exist_ok=True)
            for f in ("train.jsonl", "test.jsonl", "sft.jsonl", "sft_chat.jsonl"):
                (area / "datasets/arith" / f).write_text('{"input": "1+1=", "label": "2"}\n')
            teams.append(Team(name, team["id"], key, area, queues))
        await self.call(
            "POST", "/v1/priority-classes", a, {"name": "urgent", "value": 50, "preemptible": True}
        )
        return teams

    # -- measuring ---------------------------------------------------------------------------------------
    def server_cpu(self) -> float | None:
        """CPU seconds (user + system) of the PostgreSQL server processes serving this app's connections so far,
        or None (SQLite; a server on another machine)."""
        if self.schema is None:
            return None
        engine = sa.create_engine(PG_URL, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                pids = conn.scalars(
                    sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :n"),
                    {"n": self.app_name},
                ).all()
        finally:
            engine.dispose()
        total = 0.0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                return None
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
        return total if pids else None

    async def run(
        self, templates: list[Template], count: int, statuses: Counter[int], sizes: list[int]
    ) -> None:
        """`count` requests, `--concurrency` at a time; each template in turn, a new sequence number each."""
        it = iter(range(count))

        async def client() -> None:
            for i in it:
                self.seq += 1
                method, path, headers, body = _template_request(templates[i % len(templates)], self.seq)
                status, out = await asgi_call(self.app, method, path, headers, body)
                statuses[status] += 1
                sizes.append(len(out))

        await asyncio.gather(*(client() for _ in range(self.args.concurrency)))

    async def measure(self, name: str, templates: list[Template]) -> dict[str, Any]:
        a = self.args
        await self.run(templates, a.warm, Counter(), [])  # warm-up: caches, pools, compiled statements
        statuses: Counter[int] = Counter()
        sizes: list[int] = []
        gc.collect()
        pg0 = self.server_cpu()  # the connections stay open (the pool keeps them) across the run
        cpu0, wall0, sys0 = time.process_time(), time.perf_counter(), os.times().system
        await self.run(templates, a.n, statuses, sizes)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        system = os.times().system - sys0
        pg1 = self.server_cpu()
        pg = pg1 - pg0 if pg0 is not None and pg1 is not None else None
        row = {
            "scenario": name,
            "requests": a.n,
            "cpu_ms_per_request": cpu / a.n * 1000,
            "system_ms_per_request": system / a.n * 1000,
            "wall_ms_per_request": wall / a.n * 1000,
            "postgresql_cpu_ms_per_request": pg / a.n * 1000 if pg is not None else None,
            "statuses": dict(sorted(statuses.items())),
            "mean_response_bytes": statistics.fmean(sizes) if sizes else 0,
        }
        print(
            f"{name:<10} {row['cpu_ms_per_request']:8.2f} CPU ms/req (system {row['system_ms_per_request']:.2f}) "
            f"{row['wall_ms_per_request']:8.2f} wall "
            f"ms/req  statuses {row['statuses']}  body {row['mean_response_bytes']:.0f} B"
            + (f"  pg {pg / a.n * 1000:.2f} CPU ms/req" if pg is not None else ""),
            file=sys.stderr,
            flush=True,
        )
        return row

    def start_profiling(self) -> None:
        """A profiler in every thread started from now on (the thread pool's), and one in this thread."""
        self.profilers: list[cProfile.Profile] = []
        lock = threading.Lock()

        def start_in_thread(*_: Any) -> None:
            p = cProfile.Profile(time.thread_time)
            with lock:
                self.profilers.append(p)
            p.enable()

        threading.setprofile(start_in_thread)
        self.main_profiler = cProfile.Profile(time.thread_time)

    async def profile(self, templates: list[Template]) -> None:
        """The scenario again under cProfile, the profilers of every thread merged."""
        for p in self.profilers:
            p.clear()
        self.main_profiler.enable()
        cpu0 = time.process_time()
        await self.run(templates, self.args.n, Counter(), [])
        cpu = time.process_time() - cpu0
        self.main_profiler.disable()
        stats = pstats.Stats(self.main_profiler)
        for p in self.profilers:
            stats.add(p)
        print(f"profiled: {cpu / self.args.n * 1000:.2f} CPU ms/req under the profiler", file=sys.stderr)
        stats.sort_stats("cumulative").print_stats(self.args.top)
        stats.sort_stats("tottime").print_stats(self.args.top)


async def amain(args: argparse.Namespace) -> list[dict[str, Any]]:
    bench = Bench(args)
    try:
        bench.build()
        if args.profile:
            bench.start_profiling()
        async with bench.app.router.lifespan_context(bench.app):
            teams = await bench.set_up()
            rng = random.Random(args.seed)
            templates = {
                "submit": submission_templates(teams, rng),
                "validate": validation_templates(teams, rng),
                "list": list_templates(teams, bench.admin, rng),
            }
            rows = []
            wanted = [s for s in args.scenarios.split(",") if s]
            if args.profile:
                await bench.measure(args.profile, templates[args.profile])  # warm, and the figure
                await bench.profile(templates[args.profile])
                return rows
            for name in wanted:
                rows.append(await bench.measure(name, templates[name]))
            return rows
    finally:
        if hasattr(bench, "db"):
            bench.db.dispose()
        bench.drop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.api_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    ap.add_argument("-n", type=int, default=300, help="measured requests per scenario (default 300)")
    ap.add_argument("--warm", type=int, default=30, help="requests before measuring (default 30)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    ap.add_argument("--scenarios", default="submit,validate,list", help="comma-separated, in this order")
    ap.add_argument("--profile", choices=["submit", "validate", "list"], help="profile this scenario")
    ap.add_argument("--top", type=int, default=40, help="functions shown by --profile")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    print(
        f"db {args.db}; load average {os.getloadavg()[0]:.2f}; {args.n} requests per scenario",
        file=sys.stderr,
        flush=True,
    )
    rows = asyncio.run(amain(args))
    if args.json:
        print(json.dumps(rows, indent=1))
    bad = sum(n for r in rows for s, n in r["statuses"].items() if s >= 500)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
