"""job statuses held to JobStatus's members by CHECK constraints

`jobs.status` and `job_events.from_status`/`to_status` stay VARCHAR(20) holding the same strings; each gains a
CHECK constraint listing the statuses, so the database refuses any other value whoever writes it, and the ORM reads
the column back as `scheduler.domain.jobs.JobStatus` (scheduler/db/models.py::job_status_type). Not PostgreSQL's
native enum type: docs/adr/0008 says why. Existing rows keep their values (a row holding any other value makes the
upgrade fail, naming the constraint, and changes nothing).

SQLite cannot add a constraint to a table: batch mode rebuilds the two tables. Rebuilding `jobs` drops the old one,
which with foreign keys enforced would first delete every row that references it (ON DELETE CASCADE): the rebuild
runs with enforcement off, and the references are checked before it is turned back on.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# JobStatus's members at this revision (migrations do not import model code, which changes after them)
STATUSES = (
    "QUEUED",
    "ADMITTED",
    "STARTING",
    "RUNNING",
    "CANCELLING",
    "PREEMPTING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
)
# table -> its status columns, each with its constraint's name
CHECKED = {
    "jobs": (("status", "ck_jobs_status"),),
    "job_events": (("from_status", "ck_job_events_from_status"), ("to_status", "ck_job_events_to_status")),
}


def _condition(column: str) -> str:
    return f"{column} IN ({', '.join(repr(s) for s in STATUSES)})"


def _enforce_foreign_keys(on: bool) -> None:
    """SQLite's pragma, which only takes effect outside a transaction. The autocommit block commits what came
    before; the platform's engine still opens a transaction in it (its "begin" hook, scheduler/db/engine.py),
    empty: that one ends here, on the DB-API connection, before the pragma."""
    with op.get_context().autocommit_block():
        raw = op.get_bind().connection.dbapi_connection
        assert raw is not None
        raw.commit()
        raw.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
        assert raw.execute("PRAGMA foreign_keys").fetchone() == (int(on),)


@contextmanager
def _rebuilding() -> Iterator[None]:
    """SQLite: foreign keys unenforced while tables are rebuilt, the references checked before enforcement
    returns. A failure leaves it off on this connection only, which the migration's engine then discards (a new
    connection turns it on), and its transaction is rolled back."""
    if op.get_bind().dialect.name != "sqlite":
        yield
        return
    _enforce_foreign_keys(False)
    yield
    broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"rows reference missing ones after the rebuild: {broken[:5]}")
    _enforce_foreign_keys(True)


def upgrade() -> None:
    with _rebuilding():
        for table, columns in CHECKED.items():
            with op.batch_alter_table(table) as batch_op:  # one rebuild a table on SQLite
                for column, name in columns:
                    batch_op.create_check_constraint(name, _condition(column))


def downgrade() -> None:
    with _rebuilding():
        for table, columns in CHECKED.items():
            with op.batch_alter_table(table) as batch_op:
                for _column, name in columns:
                    batch_op.drop_constraint(name, type_="check")
