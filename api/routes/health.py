"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
import os

import sqlalchemy as sa
from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse

from api.deps import DatabaseDep, MetricsReaderDep, SettingsDep
from scheduler.db.models import Allocation, Job, Node
from scheduler.health import SUPERVISOR_STATE_ENV, readiness

log = logging.getLogger("relax.api.health")

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(db: DatabaseDep, settings: SettingsDep, response: Response) -> dict[str, str]:
    """Every part of the platform, each `up`, `down` or `unknown` (never seen: not judged); 503 while one is
    down, naming it under `down` (scheduler/health.py, docs/reliability.md). `database` says the database's
    dialect when it is up. Terse: it answers without a credential."""
    r = readiness(settings, db, supervisor_state=os.environ.get(SUPERVISOR_STATE_ENV))
    body = {"status": "ready" if r.ready else "not ready"}
    for name, part in r.parts.items():
        body[name] = "unknown" if part.ok is None else "up" if part.ok else "down"
    if body.get("database") == "up":
        body["database"] = db.dialect
    if not r.ready:
        body["down"] = ",".join(r.down)
        response.status_code = 503
        log.warning("not ready: %s", "; ".join(f"{n}: {r.parts[n].detail}" for n in r.down))
    return body


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(db: DatabaseDep, _reader: MetricsReaderDep) -> str:
    """Prometheus text format; needs an admin key or RELAX_METRICS_TOKEN (other teams' usage)."""
    with db.session(read_only=True) as s:
        by_status = s.execute(
            sa.select(Job.pool, Job.status, sa.func.count()).group_by(Job.pool, Job.status)
        ).all()
        capacity = s.execute(sa.select(Node.pool, sa.func.sum(Node.gpus)).group_by(Node.pool)).all()
        allocated = s.execute(
            sa.select(Allocation.pool, sa.func.sum(Allocation.gpus))
            .where(sa.not_(Allocation.shared))
            .group_by(Allocation.pool)
        ).all()
    lines = ["# HELP relax_jobs Jobs by pool and status.", "# TYPE relax_jobs gauge"]
    lines += [f'relax_jobs{{pool="{p}",status="{st}"}} {n}' for p, st, n in by_status]
    lines += ["# HELP relax_pool_gpus GPUs (or slots) of each pool.", "# TYPE relax_pool_gpus gauge"]
    lines += [f'relax_pool_gpus{{pool="{p}"}} {int(n or 0)}' for p, n in capacity]
    lines += [
        "# HELP relax_pool_allocated_gpus GPUs allocated to jobs.",
        "# TYPE relax_pool_allocated_gpus gauge",
    ]
    lines += [f'relax_pool_allocated_gpus{{pool="{p}"}} {int(n or 0)}' for p, n in allocated]
    return "\n".join(lines) + "\n"
