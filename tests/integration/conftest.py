"""Fixtures of the integration tests: the app over a real database and the real (embedded) broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.db.engine import Database
from scheduler.dispatch import CeleryDispatcher
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, make_broker_app


@pytest.fixture
def api(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """(client signed in as admin, settings, broker app) over each database; `client.app.state.db`."""
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    db = Database(db_url)
    key = bootstrap(db, tmp_path)
    broker = make_broker_app(settings.broker_url, tmp_path)
    app = create_app(settings, db=db, dispatcher=CeleryDispatcher(broker))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client, settings, broker
    db.dispose()
