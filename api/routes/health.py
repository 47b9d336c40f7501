"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
import os

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from api.deps import DatabaseDep, MetricsReaderDep, SettingsDep
from scheduler.health import SUPERVISOR_STATE_ENV, readiness
from scheduler.observability import EventCounts, database_metrics, process_metrics

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
def prometheus(request: Request, db: DatabaseDep, _reader: MetricsReaderDep) -> Response:
    """Prometheus text format; needs an admin key or RELAX_METRICS_TOKEN (other teams' usage). The platform's
    state read from the database now, and every process's measurements (scheduler/observability.py,
    docs/observability.md)."""
    events = getattr(request.app.state, "metric_events", None)
    if events is None:  # one per API process: its counts of job events read so far
        events = request.app.state.metric_events = EventCounts()
    body = database_metrics(db, events) + process_metrics()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
