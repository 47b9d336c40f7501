"""A scheduling pass over a long queue whose places all move, on PostgreSQL: what one pass costs.

    python -m bench.pass_db [--queued 500,2000,5000] [--passes 8] [--json]

For each size: a fresh schema of the local PostgreSQL (`RELAX_TEST_POSTGRES_URL`, database `test`; dropped
afterwards) with pool h200 of 4 nodes × 8 GPUs held whole by four running jobs, and `--queued` 1-GPU jobs
waiting behind them. Before each pass the head of the queue is cancelled, so every other job moves up one
place and the pass writes every queued job's wait (its reason names the jobs ahead): the case a busy queue
is in when jobs come and go. Reported per pass (median over `--passes`, the first two left out): the
scheduler thread's CPU, the CPU of the PostgreSQL backend serving it (found by `application_name`, read from
/proc: the server must run on this machine), and the wall time; the split comes from the pass's own log line
(lock, read, policy, write). The pass is `scheduler.scheduling.run_scheduling_pass` itself, with the real
policy; nothing is launched (the pool has no Ray).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.api_load import PG_URL

_SPLIT = re.compile(r"lock ([\d.]+), read ([\d.]+), policy ([\d.]+), write ([\d.]+)")


class _PassLines(logging.Handler):
    """Keeps the (lock, read, policy, write) milliseconds of each pass's log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.splits: list[tuple[float, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _SPLIT.search(record.getMessage())
        if m:
            self.splits.append(tuple(float(x) for x in m.groups()))


def _backend_cpu(engine: sa.Engine, app: str) -> float:
    """CPU seconds of the PostgreSQL backends whose application_name is `app`."""
    with engine.connect() as c:
        pids = c.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"), {"a": app}
        ).scalars()
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # not on this machine, or gone
                continue
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(queued: int, passes: int) -> dict[str, Any]:
    from scheduler.db.engine import Database
    from scheduler.db.migrate import upgrade
    from scheduler.dispatch import CeleryDispatcher
    from scheduler.scheduling import run_scheduling_pass
    from scheduler.services.auth import Principal
    from scheduler.services.lifecycle import JobLifecycle
    from tests.factories import bootstrap, make_broker_app, make_job, two_team_gpu_pool

    schema, app = f"relax_passdb_{os.getpid()}_{secrets.token_hex(3)}", f"relax_passdb_{os.getpid()}"
    admin_engine = sa.create_engine(PG_URL)
    with admin_engine.begin() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}&application_name={app}"
    home = Path(tempfile.mkdtemp(prefix="relax-passdb-"))
    lines = _PassLines()
    logging.getLogger("scheduler.scheduling").addHandler(lines)
    logging.getLogger("scheduler.scheduling").setLevel(logging.INFO)
    db = None
    try:
        upgrade(url)
        db = Database(url)
        bootstrap(db, home)
        two_team_gpu_pool(db)
        dispatcher = CeleryDispatcher(make_broker_app(f"sqla+sqlite:///{home / 'broker.db'}", home))
        for i in range(4):
            make_job(db, queue="math", gpus_per_replica=8, name=f"running{i}")
        run_scheduling_pass(db, dispatcher)  # the pool full
        waiting = [make_job(db, queue="vision", gpus_per_replica=1, name=f"q{i}") for i in range(queued)]
        run_scheduling_pass(db, dispatcher)  # every job's first wait
        admin = Principal(key_id="key_bench", role="admin", team_id=None)
        rows = []
        lines.splits.clear()
        for head in waiting[:passes]:
            with db.session() as s:
                JobLifecycle(s).cancel(head, admin)  # the rest move up one place
            cpu0, pg0, t0 = time.thread_time(), _backend_cpu(admin_engine, app), time.perf_counter()
            run_scheduling_pass(db, dispatcher)
            rows.append(
                (time.thread_time() - cpu0, _backend_cpu(admin_engine, app) - pg0, time.perf_counter() - t0)
            )
        kept, splits = rows[2:], lines.splits[2:]

        def med(values: list[float]) -> float:
            return round(statistics.median(values) * 1000, 1)

        return {
            "queued": queued,
            "passes": len(kept),
            "scheduler_cpu_ms": med([r[0] for r in kept]),
            "postgres_cpu_ms": med([r[1] for r in kept]),
            "wall_ms": med([r[2] for r in kept]),
            **{
                f"{part}_ms": round(statistics.median(s[i] for s in splits), 1)
                for i, part in enumerate(("lock", "read", "policy", "write"))
            },
        }
    finally:
        logging.getLogger("scheduler.scheduling").removeHandler(lines)
        if db is not None:
            db.dispose()
        with admin_engine.begin() as c:
            c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin_engine.dispose()
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pass_db", description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", default="500,2000,5000", help="comma-separated queue lengths")
    ap.add_argument("--passes", type=int, default=8, help="passes per size (the first two are left out)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.passes < 3:
        ap.error("--passes must be at least 3")
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results = [measure(int(n), args.passes) for n in args.queued.split(",") if n]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    head = ("queued", "scheduler CPU ms", "PostgreSQL CPU ms", "wall ms", "lock", "read", "policy", "write")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        cells = (
            r["queued"],
            r["scheduler_cpu_ms"],
            r["postgres_cpu_ms"],
            r["wall_ms"],
            r["lock_ms"],
            r["read_ms"],
            r["policy_ms"],
            r["write_ms"],
        )
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print("(per pass, median; lock/read/policy/write: wall ms from the pass's log line)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
