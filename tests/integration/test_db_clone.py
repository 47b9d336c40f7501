"""The tests' databases are copies of one that `upgrade()` migrated (tests/dbclone.py): a copy is the same as a
database migrated by `upgrade()` itself, on SQLite and PostgreSQL, in everything the catalog and the rows say;
and each copy is one of its own, gone after its test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import migrated_database


def _rows(conn: sa.Connection, table: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).mappings().all()
    out = []
    for row in rows:
        values = dict(row)
        if table == "spec_defaults":  # CURRENT_TIMESTAMP when the row was written: only that it is there
            assert values.pop("created_at") is not None
        out.append(tuple(sorted((k, repr(v)) for k, v in values.items())))
    return sorted(out)


def _postgres_catalog(conn: sa.Connection) -> dict[str, Any]:
    schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()

    def q(sql: str) -> list[tuple[Any, ...]]:
        # names come unqualified (the schema is the search path's); any that does not, with the schema's name out
        return sorted(
            tuple(re.sub(rf'"?{schema}"?\.', "<schema>.", v) if isinstance(v, str) else v for v in row)
            for row in conn.execute(sa.text(sql), {"s": schema}).all()
        )

    return {
        "relations": q(
            "SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text, c.reltoastrelid <> 0, "
            "c.relhasindex, c.relchecks FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :s"
        ),
        "attributes": q(
            "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.atthasdef, a.attisdropped, a.attcompression::text, a.attidentity::text, a.attgenerated::text, "
            "a.attstorage::text, a.attcollation, pg_get_expr(d.adbin, d.adrelid) "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE n.nspname = :s AND a.attnum > 0"
        ),
        "constraints": q(
            "SELECT c.relname, k.conname, k.contype::text, k.condeferrable, k.convalidated, "
            "pg_get_constraintdef(k.oid) FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "JOIN pg_namespace n ON n.oid = k.connamespace WHERE n.nspname = :s"
        ),
        "indexes": q("SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = :s"),
        "sequences": q(
            "SELECT sequencename, data_type::text, start_value, min_value, max_value, increment_by, cycle, "
            "cache_size, last_value FROM pg_sequences WHERE schemaname = :s"
        ),
        "owned_sequences": q(
            "SELECT s.relname, t.relname, a.attname, d.deptype::text FROM pg_depend d "
            "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
            "JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace n ON n.oid = s.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid WHERE n.nspname = :s"
        ),
        "other_objects": q(
            "SELECT 'type', typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE n.nspname = :s AND t.typrelid = 0 UNION ALL "
            "SELECT 'function', proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = :s UNION ALL "
            "SELECT 'trigger', tgname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND NOT g.tgisinternal"
        ),
    }


def _sqlite_catalog(conn: sa.Connection) -> dict[str, Any]:
    # Two runs of `upgrade()` itself differ in what SQLite records of `jobs` (rebuilt by alembic's batch mode,
    # whose constraints come from a set): the order of its FOREIGN KEY clauses in the CREATE TABLE text, and so
    # the pages its indexes start at. The clauses are compared as a set (their columns' order is the
    # reflection's, compared in order), the pages not at all.
    def clauses(sql: str | None) -> Any:
        if sql is None or "(" not in sql:
            return sql
        head, body = sql.split("(", 1)
        return head, sorted(part.strip() for part in body.rsplit(")", 1)[0].split(", \n"))

    rows = conn.exec_driver_sql("SELECT type, name, tbl_name, sql FROM sqlite_master").all()
    return {
        "master": sorted((t, name, table, repr(clauses(sql))) for t, name, table, sql in rows),
        "pragmas": {
            p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
            for p in (
                "journal_mode",
                "user_version",
                "application_id",
                "auto_vacuum",
                "page_size",
                "encoding",
            )
        },
    }


def snapshot(url: str) -> dict[str, Any]:
    """What a database holds: its catalog as SQLAlchemy reflects it, the dialect's own catalog, every row."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            tables = sorted(inspector.get_table_names())
            reflected = {
                t: {
                    "columns": [
                        {k: str(v) if k == "type" else v for k, v in c.items()}
                        for c in inspector.get_columns(t)
                    ],
                    "pk": inspector.get_pk_constraint(t),
                    "fks": sorted(inspector.get_foreign_keys(t), key=repr),
                    "indexes": sorted(inspector.get_indexes(t), key=repr),
                    "uniques": sorted(inspector.get_unique_constraints(t), key=repr),
                    "checks": sorted(inspector.get_check_constraints(t), key=repr),
                    "comment": inspector.get_table_comment(t) if engine.dialect.supports_comments else None,
                }
                for t in tables
            }
            catalog = (
                _postgres_catalog(conn) if engine.dialect.name == "postgresql" else _sqlite_catalog(conn)
            )
            return {
                "tables": tables,
                "views": sorted(inspector.get_view_names()),
                "sequences": sorted(inspector.get_sequence_names())
                if engine.dialect.supports_sequences
                else [],
                "reflected": reflected,
                "catalog": catalog,
                "rows": {t: _rows(conn, t) for t in tables},
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_copy_is_the_database_upgrade_makes(kind: str, tmp_path: Path) -> None:
    fresh_gen = migrated_database(kind, tmp_path / "fresh", fresh=True)
    copy_gen = migrated_database(kind, tmp_path / "copy")
    try:
        fresh, copy = snapshot(next(fresh_gen)), snapshot(next(copy_gen))
    finally:
        fresh_gen.close()
        copy_gen.close()
    # what the comparison covers, so that it cannot pass by comparing two empty things
    assert {"jobs", "job_events", "spec_defaults", "priority_classes", "alembic_version"} <= set(
        fresh["tables"]
    )
    assert len(fresh["tables"]) > 20
    assert any(c["name"] == "ck_jobs_status" for c in fresh["reflected"]["jobs"]["checks"])
    assert fresh["rows"]["alembic_version"] == [(("version_num", repr(_head())),)]
    assert len(fresh["rows"]["priority_classes"]) == 4 and len(fresh["rows"]["spec_defaults"]) == 1
    if kind == "postgresql":
        compression = {(r[0], r[2]): r[7] for r in fresh["catalog"]["attributes"]}
        assert compression[("jobs", "spec")] in ("l", "p")  # lz4 where the server has it (0003)
        assert any(r[6] for r in fresh["catalog"]["attributes"])  # 0007 dropped columns of jobs: still there
        assert len(fresh["catalog"]["sequences"]) >= 5
    else:
        assert fresh["catalog"]["pragmas"]["journal_mode"] == "wal"
    for key in fresh:
        assert copy[key] == fresh[key], key


def _head() -> str:
    from alembic.script import ScriptDirectory

    from scheduler.db.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head
    return head


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_each_copy_is_its_own_and_goes_after_its_test(kind: str, tmp_path: Path) -> None:
    first_gen = migrated_database(kind, tmp_path / "a")
    second_gen = migrated_database(kind, tmp_path / "b")
    first, second = next(first_gen), next(second_gen)
    assert first != second
    engines = [sa.create_engine(first), sa.create_engine(second)]
    try:
        with engines[0].begin() as conn:
            conn.execute(sa.text("UPDATE scheduler_locks SET holder = 'first'"))
            conn.execute(sa.text("DELETE FROM priority_classes WHERE name = 'low'"))
        with engines[1].connect() as conn:
            assert conn.execute(sa.text("SELECT holder FROM scheduler_locks")).scalars().all() == [None]
            assert "low" in conn.execute(sa.text("SELECT name FROM priority_classes")).scalars().all()
    finally:
        for e in engines:
            e.dispose()
    third_gen = migrated_database(kind, tmp_path / "c")  # one made after a copy was written to: as new
    try:
        assert (
            snapshot(next(third_gen))["rows"]["scheduler_locks"]
            == snapshot(second)["rows"]["scheduler_locks"]
        )
    finally:
        third_gen.close()
    first_gen.close()
    second_gen.close()
    if kind == "postgresql":
        from tests.conftest import PG_URL

        engine = sa.create_engine(PG_URL)
        try:
            with engine.connect() as conn:
                names = [
                    sa.make_url(u).query["options"].split("%3D")[-1].split("=")[-1] for u in (first, second)
                ]
                found = conn.execute(
                    sa.text("SELECT nspname FROM pg_namespace WHERE nspname = ANY(:n)"), {"n": names}
                ).all()
        finally:
            engine.dispose()
        assert names[0].startswith("relax_test_") and found == []
