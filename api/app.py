"""The FastAPI application factory: routers, error envelope, request ids, the dashboard."""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.audit import install_audit
from api.errors import install_error_handlers
from api.limits import RequestLimits
from api.routes import (
    evals,
    files,
    fine_tuning,
    grants,
    health,
    internal,
    jobs,
    platform,
    sessions,
    specs,
    webhooks,
)
from api.schemas import EXTRA_COMPONENTS
from runtime.redaction import install_log_redaction
from scheduler.celery_app import make_celery
from scheduler.db.engine import Database
from scheduler.dispatch import CeleryDispatcher, CoalescingDispatcher, Dispatcher
from scheduler.logs import log_context
from scheduler.memory import freeze_startup_objects
from scheduler.observability import observe_request
from scheduler.settings import Settings, get_settings

log = logging.getLogger(__name__)
WEB_DIST = Path(__file__).resolve().parents[1] / "web" / "dist"


_JOB_IN_PATH = re.compile(r"/jobs/(job_[0-9a-z]{1,40})(?:/|$)")


class _HttpMiddleware:
    """ASGI middleware that acts on HTTP requests (`http`); anything else (lifespan) passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class RequestId(_HttpMiddleware):
    """ASGI middleware: the request's id, the client's `X-Request-ID` or a new one, in `request.state.request_id`
    (error bodies, the audit log), in the answer's `X-Request-ID` header and in the log lines of the request
    (scheduler/logs.py)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = Headers(scope=scope).get("x-request-id") or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        # every line logged for this request names it, and the job its path names (the caller's team is added
        # when the key is known: api/deps.py)
        job = _JOB_IN_PATH.search(scope.get("path", ""))
        with log_context(request_id=rid, job_id=job.group(1) if job else None):
            await self.app(scope, receive, send_with_id)


class RequestMetrics(_HttpMiddleware):
    """ASGI middleware: each request's latency by method, route template (e.g. `/v1/jobs/{job_id}`, never the
    raw path: `unmatched` when no route took it) and status, in relax_http_request_duration_seconds
    (scheduler/observability.py)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        status = 500  # unless the app answers

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            observe_request(scope["method"], route, status, time.perf_counter() - t0)


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    dispatcher: Dispatcher | None = None,
) -> FastAPI:
    install_log_redaction()  # no key or token in this process's logs, uvicorn's access log included
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # the thread pool that runs sync routes and dependencies (anyio's, 40 threads by default)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api.api_threads
        freeze_startup_objects()
        # one line a worker at start and at stop, so that each process's log says when it served (the database by
        # its kind only: its URL may hold a password)
        kind = settings.database_url.partition(":")[0]
        log.info("API worker %d serving (%s, %d threads)", os.getpid(), kind, settings.api.api_threads)
        yield
        log.info("API worker %d stopping", os.getpid())

    app = FastAPI(
        title="Relax Platform",
        version="0.1.0",
        description="Training-as-a-service for LLM post-training on the Relax pipeline.",
        lifespan=lifespan,
        # off unless asked for: FastAPI looks for OpenTelemetry providers on every request otherwise
        telemetry=None if settings.api.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.artifact_root = (
        settings.artifacts
    )  # resolved once (`Settings.artifacts` resolves it on each call)
    app.state.db = db or Database(settings.database_url, echo=settings.database.echo)
    app.state.units_of_work = weakref.WeakKeyDictionary()  # api/deps.py: a bound per event loop
    # the API asks for a pass after each change: coalesced, published off the request's thread
    app.state.dispatcher = dispatcher or CoalescingDispatcher(CeleryDispatcher(make_celery(settings)))

    # innermost: its refusals carry the request id and are audited (the middlewares below are outer)
    app.add_middleware(RequestLimits, settings=settings.api)
    app.add_middleware(RequestId)
    app.add_middleware(RequestMetrics)  # outermost: the whole request's time
    install_error_handlers(app)
    install_audit(app)
    for router in (
        *(m.router for m in (health, jobs, specs, platform, grants, sessions, webhooks, evals, internal)),
        files.router,
        files.uploads_router,
        fine_tuning.router,
    ):
        app.include_router(router)
    if not settings.api.otel:  # FastAPI's telemetry spans the handler the fast path leaves out
        jobs.install_submit_fast_path(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            FastAPI.openapi(app)["components"]["schemas"].update(EXTRA_COMPONENTS)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

    if (WEB_DIST / "index.html").exists():
        app.mount("/", StaticFiles(directory=WEB_DIST, html=True), name="dashboard")
    else:

        @app.get("/", response_class=HTMLResponse, include_in_schema=False)
        def index() -> str:
            return (
                "<html><body><h1>Relax Platform</h1><p>The API is up. The dashboard is not built "
                "(<code>make web</code>). See <a href='/docs'>/docs</a>.</p></body></html>"
            )

    return app
