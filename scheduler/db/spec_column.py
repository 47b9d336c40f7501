"""A job's spec stored as what differs from the defaults.

A normalized spec has every one of the ~1,060 parameters (~33 kB of JSON); a job sets a few dozen. Storing all of
them cost PostgreSQL ~1.2 ms of CPU per submission to build the JSONB (lz4-compressed TOAST), ~25 times the cost
of the ~1 kB a job's own values take (measured in docs/reliability.md "Load"). The column therefore holds

    {"$defaults": "<id of the defaults>", "<field>": <value>, ...}   (only the values that differ from them)

and reading it gives the whole spec again. Defaults change when the platform is upgraded (a new Megatron-LM or
Relax reference); a spec must keep the defaults it was submitted with, so the defaults are content-addressed: their
id is a hash of their JSON, and each set ever used is kept in the `spec_defaults` table. This process's own set is
known without the table; another set (a job submitted before an upgrade) is read from it once per process.

Rows written before this existed hold the whole spec (no "$defaults" key) and are read as they are.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from jobspec.spec import JobSpec
from scheduler.db.jsontext import json_dumps, json_loads

DEFAULTS_KEY = "$defaults"

_lock = threading.Lock()
_known: dict[
    str, dict[str, Any]
] = {}  # defaults id -> the defaults (content-addressed: the same in every database)
_engines: weakref.WeakSet[sa.Engine] = weakref.WeakSet()  # where an unknown set may be read

SPEC_DEFAULTS = sa.table(
    "spec_defaults", sa.column("id", sa.String), sa.column("spec_values", sa.Text), sa.column("created_at")
)


@cache
def current_defaults() -> tuple[str, dict[str, Any]]:
    """(id, values): every parameter's default as this platform's job spec declares it (before the rules derive
    anything), the id the first 20 hex digits of the SHA-256 of their JSON with sorted keys."""
    values = _hold(JobSpec.model_validate({}).to_dict())
    text = json_dumps(dict(sorted(values.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:20], values


@cache
def _positions() -> dict[str, int]:
    """Each default's place in the defaults (the spec's field order)."""
    return {name: i for i, name in enumerate(current_defaults()[1])}


@cache
def _unlike_dump() -> frozenset[str]:
    """The fields whose default, as a validated spec holds it, `compact` would not take as the default's JSON
    (none while a validated spec holds JSON values only): compared whatever `differing_at_most_in` names."""
    _, defaults = current_defaults()
    held = JobSpec.model_validate({}).__dict__
    return frozenset(
        k
        for k, d in defaults.items()
        if (v := held.get(k, defaults)) is not d and (type(d) is not type(v) or d != v)  # noqa: E721
    )


def defaults_row() -> dict[str, str]:
    """This platform's defaults as a `spec_defaults` row's values."""
    ident, values = current_defaults()
    return {"id": ident, "spec_values": json_dumps(dict(sorted(values.items())))}


# (spec, names) while `differing_at_most_in(spec, names)` runs: `compact(spec)` compares only those names
_ONLY: ContextVar[tuple[dict[str, Any], Collection[str]] | None] = ContextVar(
    "spec_column_only", default=None
)


@contextmanager
def differing_at_most_in(spec: dict[str, Any], names: Collection[str]) -> Iterator[None]:
    """While in it, `compact(spec)` (this very dict, as an INSERT binds it) compares only `names` with the
    defaults, in the defaults' order, instead of all ~1,060 (~0.9M instructions): the caller vouches that `spec`
    has the defaults' keys, in their order, and that every value outside `names` is the default's (a spec
    `normalize` made: its given and derived fields, `NormalizedSpec.changed`, and its path fields, which path
    resolution rewrites). The stored value is the one `compact(spec)` gives without it."""
    token = _ONLY.set((spec, names))
    try:
        yield
    finally:
        _ONLY.reset(token)


def compact(spec: dict[str, Any]) -> dict[str, Any]:
    """What `spec` sets beyond this platform's defaults, with their id. A key the defaults lack is kept, and a
    default that `spec` lacks (a partial dict) is listed under "$absent" so that it does not come back. Values
    compare as JSON at the top level (1, 1.0 and True differ); inside a list or a dict, as Python compares them
    (the spec's field types fix those: a list of floats holds floats)."""
    if DEFAULTS_KEY in spec:
        return spec
    ident, defaults = current_defaults()
    get, missing = defaults.get, object()
    only = _ONLY.get()
    if only is not None and only[0] is spec and len(spec) == len(defaults):
        position = _positions()
        names = sorted({n for n in only[1] if n in position}.union(_unlike_dump()), key=position.__getitem__)
        return {
            DEFAULTS_KEY: ident,
            **{
                k: v
                for k in names
                if (d := get(k, missing)) is not (v := spec[k]) and (type(d) is not type(v) or d != v)  # noqa: E721
            },
        }
    out = {
        k: v
        for k, v in spec.items()
        if (d := get(k, missing)) is not v and (type(d) is not type(v) or d != v)  # noqa: E721 (JSON types)
    }
    if len(spec) != len(defaults) or spec.keys() != defaults.keys():
        absent = sorted(defaults.keys() - spec.keys())
        if absent:
            out["$absent"] = absent
    return {DEFAULTS_KEY: ident, **out}


def expand(stored: dict[str, Any]) -> dict[str, Any]:
    """The whole spec of a stored one (a row from before this module: as it is)."""
    ident = stored.get(DEFAULTS_KEY)
    if ident is None:
        return stored
    return _merged(stored, _defaults(ident))


def expand_with(stored: dict[str, Any], known: dict[str, str]) -> dict[str, Any]:
    """`expand` with the defaults given as `spec_defaults` rows' JSON by id (the migration going down)."""
    ident = stored.get(DEFAULTS_KEY)
    if ident is None:
        return stored
    if ident not in known:
        raise LookupError(f"a job's spec names defaults {ident}, which spec_defaults does not hold")
    return _merged(stored, json_loads(known[ident]))


def _merged(stored: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    spec = dict(defaults)
    for key in stored.get("$absent", ()):
        spec.pop(key, None)
    spec.update(stored)
    del spec[DEFAULTS_KEY]
    spec.pop("$absent", None)
    # lists and dicts of the defaults are shared by every spec read: each gets its own copy, to change at will
    containers = _CONTAINERS.get(id(defaults)) if defaults is _held(id(defaults)) else None
    if containers is None:
        containers = tuple(k for k, v in defaults.items() if isinstance(v, dict | list))
    for key in containers:
        value = spec.get(key)
        if value is defaults[key]:
            spec[key] = json_loads(json_dumps(value))
    return spec


# The list and dict keys of the sets of defaults this process holds for good (its own, those read into `_known`),
# by the sets' ids; `_HELD` keeps the sets themselves, so an id is never that of another dict.
_CONTAINERS: dict[int, tuple[str, ...]] = {}
_HELD: dict[int, dict[str, Any]] = {}


def _hold(defaults: dict[str, Any]) -> dict[str, Any]:
    _HELD[id(defaults)] = defaults
    _CONTAINERS[id(defaults)] = tuple(k for k, v in defaults.items() if isinstance(v, dict | list))
    return defaults


def _held(ident: int) -> dict[str, Any] | None:
    return _HELD.get(ident)


def _defaults(ident: str) -> dict[str, Any]:
    own, values = current_defaults()
    if ident == own:
        return values
    with _lock:
        found = _known.get(ident)
    if found is not None:
        return found
    for engine in list(_engines):
        try:
            with engine.connect() as conn:
                text = conn.execute(
                    sa.select(SPEC_DEFAULTS.c.spec_values).where(SPEC_DEFAULTS.c.id == ident)
                ).scalar()
        except sa.exc.DBAPIError:
            continue
        if text is not None:
            with _lock:
                _known[ident] = _hold(json_loads(text))
            return _known[ident]
    raise LookupError(
        f"a job's spec was stored against defaults {ident}, which no database this process uses records "
        "(table spec_defaults); run `python -m scheduler.dbinit` with the platform version that wrote it"
    )


def watch(engine: sa.Engine) -> None:
    """Read unknown defaults from `engine` when a spec needs them, and record this platform's defaults there at
    its first connection (where the table exists: a database not migrated yet gets them from the migration)."""
    _engines.add(engine)

    @sa.event.listens_for(engine, "first_connect")
    def _record(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        record_defaults_dbapi(dbapi_conn, engine.dialect.name)


def record_defaults_dbapi(dbapi_conn: Any, dialect: str) -> None:
    """Insert this platform's defaults row through a DBAPI connection, unless it is there (or the table is not)."""
    row = defaults_row()
    mark = "%s" if dialect == "postgresql" else "?"
    cur = dbapi_conn.cursor()
    try:
        try:
            cur.execute(f"SELECT 1 FROM spec_defaults WHERE id = {mark}", (row["id"],))
        except Exception:  # no such table yet: the migration that creates it records the row
            dbapi_conn.rollback()
            return
        if cur.fetchone() is None:
            cur.execute(
                f"INSERT INTO spec_defaults (id, spec_values, created_at) VALUES ({mark}, {mark}, CURRENT_TIMESTAMP)",
                (row["id"], row["spec_values"]),
            )
        dbapi_conn.commit()
    finally:
        cur.close()


def record_defaults(conn: sa.Connection) -> None:
    """Insert this platform's defaults row through `conn` unless it is there (the migration and `upgrade`)."""
    row = defaults_row()
    if conn.execute(sa.select(SPEC_DEFAULTS.c.id).where(SPEC_DEFAULTS.c.id == row["id"])).first() is None:
        conn.execute(SPEC_DEFAULTS.insert().values(**row, created_at=sa.func.current_timestamp()))


class SpecJSON(TypeDecorator[dict[str, Any]]):
    """The jobs.spec column: a whole spec in, a whole spec out; what differs from the defaults in the database."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(sa.JSON())

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return compact(value) if isinstance(value, dict) else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return expand(value) if isinstance(value, dict) else value
