"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from api.deps import DatabaseDep, MetricsReaderDep
from scheduler.db.models import Allocation, Job, Node

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(db: DatabaseDep) -> dict[str, str]:
    with db.session(read_only=True) as s:
        s.execute(sa.text("SELECT 1"))
    return {"status": "ready", "database": db.dialect}


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
