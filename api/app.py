"""The FastAPI application factory: routers, error envelope, request ids, the dashboard."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.audit import install_audit
from api.errors import install_error_handlers
from api.limits import RequestLimits
from api.routes import grants, health, internal, jobs, platform, sessions, specs
from runtime.redaction import install_log_redaction
from scheduler.celery_app import make_celery
from scheduler.db.engine import Database
from scheduler.dispatch import CeleryDispatcher, Dispatcher
from scheduler.settings import Settings, get_settings

log = logging.getLogger(__name__)
WEB_DIST = Path(__file__).resolve().parents[1] / "web" / "dist"


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    dispatcher: Dispatcher | None = None,
) -> FastAPI:
    install_log_redaction()  # no key or token in this process's logs, uvicorn's access log included
    settings = settings or get_settings()
    app = FastAPI(
        title="Relax Platform",
        version="0.1.0",
        description="Training-as-a-service for LLM post-training on the Relax pipeline.",
    )
    app.state.settings = settings
    app.state.db = db or Database(settings.database_url, echo=settings.database.echo)
    app.state.dispatcher = dispatcher or CeleryDispatcher(make_celery(settings, with_tasks=False))

    # innermost: its refusals carry the request id and are audited (the middlewares below are outer)
    app.add_middleware(RequestLimits, settings=settings.api)

    @app.middleware("http")
    async def request_id(request: Request, call_next):  # type: ignore[no-untyped-def]
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        request.state.request_id = rid
        response = await call_next(request)
        response.headers["X-Request-ID"] = rid
        return response

    install_error_handlers(app)
    install_audit(app)
    for module in (health, jobs, specs, platform, grants, sessions, internal):
        app.include_router(module.router)

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
