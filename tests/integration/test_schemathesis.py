"""Schemathesis over every route of the app's OpenAPI document, in process, with an admin key: no input gives
a 5xx, and no response falls outside its declared schema (status code, content type, body). Issue 11 item 6.

A small example budget (5 per route and mode) keeps the module near 10 s per database; the cases that
fuzzing found before are tests of their own in test_bounds.py, so a failure here is new. The operations are
run one by one with Hypothesis (`operation.as_strategy`) rather than through schemathesis' pytest
integration, whose lazy `from_fixture` fails under pytest 9.2 ("'Function' object has no attribute
'_nodeid'"), and whose import-time schema would need the app before its database exists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.dispatch import CeleryDispatcher
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.conftest import _drop_schema, _postgres_schema_url
from tests.factories import bootstrap, make_broker_app

EXAMPLES = 5  # per operation and mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One app over one database for every route's examples (a database per example would cost more than
    the examples): (app, admin key)."""
    home: Path = tmp_path_factory.mktemp("schemathesis")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'relax.db'}"
    else:
        url, schema = _postgres_schema_url()
    try:
        upgrade(url)
        settings_ = Settings(
            home=home,
            database=DatabaseSettings(url=url),
            celery=CelerySettings(broker_url=f"sqla+sqlite:///{home / 'broker.db'}"),
        )
        db = Database(url)
        try:
            key = bootstrap(db, home)
            broker = make_broker_app(settings_.broker_url, home)
            yield create_app(settings_, db=db, dispatcher=CeleryDispatcher(broker)), key
        finally:
            db.dispose()
    finally:
        if schema is not None:
            _drop_schema(schema)


def test_every_route_answers_within_its_schema(fuzzed_app: Any) -> None:
    """Every operation, with inputs valid by the schema (positive) and invalid by it (negative). Each
    route's failures are collected, so that one report names every route that fails."""
    app, key = fuzzed_app
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: dict[str, str] = {}
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert len(operations) >= 40  # every route (the dashboard's and the docs' pages are not in the schema)
    for operation in operations:
        # a route of string path parameters alone has no invalid input (any text is a name or an id);
        # the key is sent with every case
        invalid = bool(
            len(operation.body)
            or len(operation.query)
            or [h for h in operation.headers if h.name != "authorization"]
        )
        for mode in (
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if invalid else (GenerationMode.POSITIVE,)
        ):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate],
            )
            def run(case: Any) -> None:
                case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, checks=CHECKS)

            try:
                run()
            except Unsatisfiable:  # every invalid input schemathesis makes is one the schema allows
                continue
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - reported together below
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:3000]
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
