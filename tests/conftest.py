"""Shared fixtures: real databases (SQLite and the local PostgreSQL), settings in a temp home."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.dbclone import (
    admin_engine,
    create_migrated_schema,
    drop_schema,
    migrated_sqlite,
    new_schema_name,
    schema_url,
)

PG_URL = os.environ.get("RELAX_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
# Under pytest-xdist (`make test PYTEST_XDIST="-n 2 --dist loadgroup"`) each worker has its own Redis
# database: gw0 (and a serial run) 15, gw1 14, ... PostgreSQL needs nothing per worker: every test gets its
# own schema (below).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
REDIS_URL = os.environ.get(
    "RELAX_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - int(_WORKER.removeprefix('gw') or 0) % 16}"
)

# Every Ray a test starts (`ray.init(address="local")`, drivers run standalone) binds 127.0.0.1 only (Ray's
# single-machine mode) and runs with token auth, as the embedded platform's does (api/embedded.py), with a
# token of this session: never ~/.ray/auth_token, never one in the environment. Nor does it phone home.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
if "RAY_AUTH_MODE" not in os.environ:
    _ray_token_dir, _owner = tempfile.mkdtemp(prefix="relax-test-ray-"), os.getpid()  # 0700
    atexit.register(lambda: os.getpid() == _owner and shutil.rmtree(_ray_token_dir, ignore_errors=True))
    _fd = os.open(os.path.join(_ray_token_dir, "auth_token"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(_fd, "w") as _fh:
        _fh.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = os.path.join(_ray_token_dir, "auth_token")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Nor does anything reach the Hugging Face Hub (every model and tokenizer of the suite is built locally): a
# driver that looks a model name up on the Hub, as one with an empty spec does (tests/ray/test_job_credentials.py),
# fails at once offline instead of after ~50 s of retries where the Hub cannot be resolved (this machine).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _postgres_schema_url() -> tuple[str, str]:
    """A new, empty schema of the local PostgreSQL: (URL with it as the search path, its name)."""
    schema = new_schema_name()
    try:
        with admin_engine(PG_URL).begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as err:
        pytest.fail(f"the local PostgreSQL at {PG_URL} is not reachable ({err.orig}); tests need it")
    return schema_url(PG_URL, schema), schema


def _drop_schema(schema: str) -> None:
    drop_schema(PG_URL, schema)


def migrated_database(kind: str, tmp_path: Path, *, fresh: bool = False) -> Iterator[str]:
    """A database of its own at head, dropped after: a copy of one that `upgrade()` migrated in this process
    (tests/dbclone.py), or with `fresh` migrated by `upgrade()` itself."""
    from scheduler.db.migrate import upgrade

    if kind == "sqlite":
        if fresh:
            url = f"sqlite:///{tmp_path / 'relax.db'}"
            upgrade(url)
        else:
            url = migrated_sqlite(tmp_path / "relax.db")
        yield url
        return
    if fresh:
        url, schema = _postgres_schema_url()
    else:
        schema = new_schema_name()
        try:
            url = create_migrated_schema(PG_URL, schema)
        except sa.exc.OperationalError as err:
            pytest.fail(f"the local PostgreSQL at {PG_URL} is not reachable ({err.orig}); tests need it")
    try:
        if fresh:
            upgrade(url)
        yield url
    finally:
        _drop_schema(schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind, migrated to head (a copy: tests/dbclone.py)."""
    yield from migrated_database(request.param, tmp_path)


@pytest.fixture
def relax_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("RELAX_HOME", str(home))
    return home


# Running in parallel (`make test` runs two pytest-xdist workers, `-n 2 --dist loadgroup`; see the Makefile):
# what starts Ray, a Celery worker or a whole platform is "heavy", and the heavy tests run in two lanes, each
# lane on one worker, its tests one after another as in a serial run: two Rays started by
# `ray.init(address="local")` would share Ray's fixed default ports (so tests/ray/ is all in one lane; the
# embedded platform's Ray takes free ports, so one of those beside one of these is fine), a Celery test flushes
# its worker's Redis database, and a module's platform is shared by its tests.
# The first lane is handed out first, then every light test (unit tests, the API over SQLite and PostgreSQL,
# subprocesses of the API or the scheduler, gloo worlds on free loopback ports) one at a time to whichever worker
# is free, and the last lane after them: so for most of the run one worker runs heavy tests beside light ones,
# never two heavy tests at once. Two heavy tests side by side on two cores each run 2-3x slower than alone (their
# Ray actors, gloo ranks, engines and platforms outnumber the cores: megatron's TP=2 learning test took 277 s
# beside tests/ray, 129 s beside light tests and 100 s alone), so the lanes finish sooner one after another than
# side by side: pytest 1,161 s with three heavy groups at once, 1,056 s with one heavy lane (2026-12-05, this
# machine shared with other work). The last lane is sized so that the light tests plus it take about as long as
# the first lane. Each test's PostgreSQL schema and tmp_path are its own, each worker has its own Redis database
# (REDIS_URL), the Hypothesis database (.hypothesis/) writes atomically under keys of its own per test, and
# pytest's cache is off (-p no:cacheprovider). Timeouts in the heavy tests allow for a neighbour on two cores.
FIRST, LAST = "heavy-first", "heavy-last"
HEAVY_LANES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        LAST,  # ~380 s: platforms of their own (free ports), a Celery worker, the browser
        (
            # 81 s on the shared platform (2026-12-06, ci junit: the first lane 1,291 s, the light tests plus
            # this lane 1,104 s; with it here, and test_job_credentials 38 s shorter, ~1,170 s and ~1,185 s)
            "tests/e2e/test_walking_skeleton.py",
            "tests/e2e/test_pipeline_features.py",
            "tests/e2e/test_evals.py",
            "tests/e2e/test_openai_fine_tuning.py",
            # platforms of its own (`relaxctl up`), 29 s (2026-12-07 ci junit: the first lane 1,377 s, the light
            # tests plus this lane 1,293 s)
            "tests/e2e/test_platform_cli.py",
            "tests/integration/test_celery_worker.py",  # a real Celery worker process (and Redis's flushdb)
            # compose.yaml's services as processes: 2 APIs, 2 schedulers, a pool worker (and Redis's flushdb)
            "tests/integration/test_compose_topology.py",
            "tests/browser/",
        ),
    ),
    # ~1,000 s: every other end-to-end module, and every local Ray (at 2e66d33+, with the two end-to-end modules
    # above in it, the whole suite took 1,224 s: this lane was the longer one by far)
    (FIRST, ("tests/e2e/", "tests/ray/")),
)


def heavy_group(nodeid: str) -> str | None:
    for lane, paths in HEAVY_LANES:
        if nodeid.startswith(paths):
            return lane
    return None


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI timeout, `timeout`, `kill`) ends the run as Ctrl-C does, so fixtures tear down what they
    started: platforms, Ray heads and workers run in sessions of their own and would outlive a killed pytest
    (bench/harness.py also stops its platforms at exit)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    main = threading.current_thread() is threading.main_thread()  # only there may a handler be set
    if main and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        lane = heavy_group(item.nodeid)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))
    # the first lane, then the light tests as collected, then the last lane (a stable sort keeps each module
    # together); inside a lane, the end-to-end modules that share one platform (tests/e2e/conftest.py) first,
    # next to each other, so that it starts once a lane, then those that share its platform of three slots (in
    # the first lane: test_elastic_rollout, test_megatron_learns, whose SFT warm-up test_multinode copies after
    # it, test_network_exposure, and test_reliability, which kills it), then those that share its one-slot
    # platform, then the tests on the local Ray that tests/ray/conftest.py's `ray_local` keeps up from one
    # module to the next
    position = {FIRST: 0, None: 1, LAST: 2}
    items.sort(
        key=lambda item: (
            position[heavy_group(item.nodeid)],
            "_e2e_shared_platform" not in getattr(item, "fixturenames", ()),
            "three_slot_platform" not in getattr(item, "fixturenames", ()),
            "one_slot_platform" not in getattr(item, "fixturenames", ()),
            "ray_local" not in getattr(item, "fixturenames", ()),
        )
    )


try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # pytest-xdist is in the dev extra; without it the suite runs serially
    LoadGroupScheduling = None

if LoadGroupScheduling is not None:

    class _HeavyGroupScheduling(LoadGroupScheduling):
        """--dist loadgroup, with the group of the tests above decided from their node ids on the controller:
        the `xdist_group` mark alone no longer reaches xdist's scheduler under pytest >= 9.2, which stopped
        honouring xdist's rewrite of `item._nodeid` (pytest-dev/pytest-xdist#1386)."""

        def _split_scope(self, nodeid: str) -> str:
            return heavy_group(nodeid) or super()._split_scope(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
        if config.getvalue("dist") == "loadgroup":
            # in collection order (the heavy groups first), not xdist's default of the biggest groups first
            config.option.loadscopereorder = False
            return _HeavyGroupScheduling(config, log)
        return None
