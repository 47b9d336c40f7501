"""A job's spec is stored as what differs from its defaults, and read whole (scheduler/db/spec_column.py): over the
API on SQLite and PostgreSQL, for rows written against this platform's defaults, against an older set that only
`spec_defaults` remembers, and for rows from before (whole specs); and back to whole specs when the migration goes
down."""

from __future__ import annotations

import sqlalchemy as sa

from scheduler.db.jsontext import json_dumps, json_loads
from scheduler.db.migrate import downgrade, upgrade
from scheduler.db.spec_column import DEFAULTS_KEY, current_defaults
from tests.factories import grpo_spec


def _stored(db, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    """The jobs.spec column as the database holds it (not through the column's type)."""
    with db.engine.connect() as conn:
        text = conn.execute(
            sa.text("SELECT CAST(spec AS TEXT) FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar()
    return json_loads(text)


def _store(db, job_id: str, value: dict) -> None:  # type: ignore[no-untyped-def]
    cast = "CAST(:spec AS JSONB)" if db.dialect == "postgresql" else ":spec"
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE jobs SET spec = {cast} WHERE id = :id"),
            {"spec": json_dumps(value), "id": job_id},
        )


def _submit(client, **overrides) -> dict:  # type: ignore[no-untyped-def]
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**overrides)})
    assert r.status_code == 201, r.text
    return r.json()


def test_the_row_holds_the_jobs_own_values_and_reads_back_whole(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    db = client.app.state.db
    body = _submit(client, seed=7)
    whole = body["spec"]
    assert len(whole) > 1000  # every parameter
    stored = _stored(db, body["id"])
    ident, defaults = current_defaults()
    assert stored[DEFAULTS_KEY] == ident
    own = {k: v for k, v in stored.items() if k != DEFAULTS_KEY}
    assert own["seed"] == 7 and own["lr"] == 1e-3 and own["rollout_batch_size"] == 4
    # exactly the values that differ from the defaults, and nothing else
    assert own == {k: v for k, v in whole.items() if defaults[k] != v or type(defaults[k]) is not type(v)}
    assert len(json_dumps(stored)) < 3000 < len(json_dumps(whole))
    assert client.get(f"/v1/jobs/{body['id']}").json()["spec"] == whole
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, spec_values FROM spec_defaults")).all()
    assert [(i, json_loads(v)) for i, v in rows] == [(ident, defaults)]


def test_a_spec_stored_against_older_defaults_reads_with_them(api) -> None:  # type: ignore[no-untyped-def]
    """An upgrade changed a default (seed 1234 -> 99) and added a parameter: a job submitted before keeps the
    defaults it was submitted with, which only the database remembers."""
    client, _, _ = api
    db = client.app.state.db
    body = _submit(client)
    _, defaults = current_defaults()
    older = {k: v for k, v in defaults.items() if k != "rollout_seed"} | {"seed": 99}
    old_id = "0123456789abcdef0123"
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO spec_defaults (id, spec_values, created_at) VALUES (:id, :v, CURRENT_TIMESTAMP)"
            ),
            {"id": old_id, "v": json_dumps(older)},
        )
    stored = {k: v for k, v in _stored(db, body["id"]).items() if k not in ("seed", "rollout_seed")}
    _store(db, body["id"], {**stored, DEFAULTS_KEY: old_id})
    spec = client.get(f"/v1/jobs/{body['id']}").json()["spec"]
    assert spec["seed"] == 99 and "rollout_seed" not in spec
    assert {k: v for k, v in spec.items() if k != "seed"} == {
        k: v for k, v in body["spec"].items() if k not in ("seed", "rollout_seed")
    }


def test_a_whole_spec_from_before_reads_as_it_is(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    db = client.app.state.db
    body = _submit(client)
    _store(db, body["id"], body["spec"])
    assert DEFAULTS_KEY not in _stored(db, body["id"])
    assert client.get(f"/v1/jobs/{body['id']}").json()["spec"] == body["spec"]


def test_going_down_writes_whole_specs_back_and_up_again_keeps_them(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    db = client.app.state.db
    body = _submit(client, seed=5)
    db.engine.dispose()
    downgrade(settings.database_url, "0003")
    stored = _stored(db, body["id"])
    assert stored == body["spec"]  # whole, without the defaults' id
    with db.engine.connect() as conn:
        assert "spec_defaults" not in sa.inspect(conn).get_table_names()
    upgrade(settings.database_url)
    db.engine.dispose()
    assert client.get(f"/v1/jobs/{body['id']}").json()["spec"] == body["spec"]
    later = _submit(client)
    assert DEFAULTS_KEY in _stored(db, later["id"])
