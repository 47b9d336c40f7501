"""Platform settings: one typed tree read from RELAX_* environment variables."""

from __future__ import annotations

import os
import re
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# A pool name as a file name: no "/", no leading ".".
_POOL_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _home() -> Path:
    return Path(os.environ.get("RELAX_HOME", ".relax")).expanduser().resolve()


class ApiSettings(BaseSettings):
    """The HTTP API process."""

    model_config = SettingsConfigDict(env_prefix="RELAX_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address the API binds to.")
    port: int = Field(8400, description="Port of the API and the dashboard.")
    public_url: str | None = Field(
        None,
        description="URL at which job drivers on the Ray clusters reach the API "
        "(default: http://<host>:<port>).",
    )
    metrics_token: str | None = Field(
        None,
        description="Bearer token that Prometheus scrapers send to /metrics (RELAX_METRICS_TOKEN); "
        "admin API keys work too. Unset: admin keys only.",
    )
    api_threads: int = Field(
        8,
        ge=1,
        le=24,
        description="Threads of each API worker process that run routes and database work, and requests that "
        "hold a unit of work at once (RELAX_API_THREADS); requests beyond them wait their turn on the event "
        "loop. Fewer than the database pool's 30 connections a process, so that they never run it dry; more "
        "threads than cores only add contention for Python's GIL (bench/api_load.py).",
    )
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry: traces, metrics and logs of each request through the "
        "OpenTelemetry providers the process has (e.g. set up by `opentelemetry-instrument`) (RELAX_OTEL). Off "
        "unless set, sparing every request the look for configured providers; the platform's own metrics are "
        "at /metrics either way (docs/observability.md).",
    )
    max_body_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest request body the API reads (RELAX_MAX_BODY_BYTES); a larger one is refused with "
        "413. A job spec, its flags and a launch script's text (256 KiB at most) fit the default.",
    )
    max_report_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest body of a driver's report (RELAX_MAX_REPORT_BODY_BYTES): up to 1,000 log lines, "
        "metrics and records of each kind a batch, which a driver resends until accepted.",
    )
    max_upload_body_bytes: int = Field(
        (512 + 1) * 1024 * 1024,
        ge=1024,
        description="Largest body of a file upload (`POST /v1/files`, `POST /v1/uploads/{id}/parts`; "
        "RELAX_MAX_UPLOAD_BODY_BYTES): streamed to disk, never held in memory. The files' own limits "
        "(RELAX_FILES_*) are checked on top.",
    )


class DatabaseSettings(BaseSettings):
    """The relational database holding jobs, events, metrics and logs."""

    model_config = SettingsConfigDict(env_prefix="RELAX_DATABASE_", extra="ignore")

    url: str | None = Field(
        None,
        description="SQLAlchemy URL; PostgreSQL in production "
        "(postgresql+psycopg://user@host/db). Default: SQLite at $RELAX_HOME/relax.db.",
    )
    echo: bool = Field(False, description="Log every SQL statement.")


class CelerySettings(BaseSettings):
    """The task broker between the scheduler and the pool workers."""

    model_config = SettingsConfigDict(env_prefix="RELAX_", extra="ignore")

    broker_url: str | None = Field(
        None,
        description="Celery broker: redis://… or amqp://… in production. "
        "Default: an embedded SQLite transport at $RELAX_HOME/broker.db.",
    )
    broker_poll_seconds: float = Field(
        0.05,
        gt=0,
        le=60,
        description="Polling interval of the embedded SQL transport right after a message (seconds).",
    )
    broker_idle_poll_seconds: float = Field(
        0.5,
        gt=0,
        le=60,
        description="Longest polling interval of the embedded SQL transport, reached as its queues stay empty "
        "(seconds): the most the first hand-off after a quiet spell waits (scheduler/broker_sql.py).",
    )


class SchedulerSettings(BaseSettings):
    """The scheduling pass and the pool reconcilers."""

    model_config = SettingsConfigDict(env_prefix="RELAX_SCHEDULER_", extra="ignore")

    tick_seconds: float = Field(
        2.0, description="Period of the beat that runs a scheduling pass and reconciles every pool."
    )
    pass_interval_seconds: float = Field(
        0.5,
        ge=0,
        description="Least time between the starts of two scheduling passes of a worker process. Passes "
        "asked for meanwhile (one after each submission, cancel or change) are served by one pass after it.",
    )
    pass_duty: float = Field(
        0.33,
        gt=0,
        le=1,
        description="Most of the time a worker process's scheduling passes may take: after a pass of d seconds "
        "the next starts no sooner than d / pass_duty after it started (and never sooner than "
        "pass_interval_seconds). Over a backlog of thousands of queued jobs a pass takes long, and submissions "
        "keep asking for more: this bounds the scheduler's share of a core, at the cost of admitting later.",
    )
    preempt_grace_seconds: float = Field(
        120.0,
        description="How long a preempted job's driver has to checkpoint and exit before its Ray job is stopped.",
    )
    launch_grace_seconds: float = Field(
        60.0,
        description="How long a STARTING job may have no Ray job before the reconciler resubmits it.",
    )
    # Supervision and recovery (docs/reliability.md) ------------------------------------------------
    heartbeat_seconds: float = Field(
        2.0,
        gt=0,
        description="How often each Celery worker records its heartbeat in the database (`/readyz` judges a "
        "worker down when its newest heartbeat is older than max(5 x this, 10 s)).",
    )
    driver_silence_seconds: float = Field(
        120.0,
        gt=0,
        description="A RUNNING job whose driver has sent nothing (a report or its 5 s heartbeat) for this long "
        "while the API answers is lost: its Ray job is stopped and it is resumed from its latest checkpoint "
        "(also when the pool's Ray does not answer). Measured from the worker's own start at the earliest.",
    )
    max_driver_restarts: int = Field(
        3,
        ge=0,
        description="How many times a job whose driver was lost (killed, its node or Ray gone, silent) is "
        "resumed from its latest checkpoint before it is FAILED as `lost`; a job with --use-fault-tolerance "
        "sets its own limit with --max-global-restart.",
    )
    final_report_grace_seconds: float = Field(
        300.0,
        description="How long a job whose Ray job ended without error waits for its driver's final report "
        "(delivered late, or collected from the driver's spool) before it is FAILED as lost; it is SUCCEEDED "
        "only once that report is stored.",
    )


class RaySettings(BaseSettings):
    """The Ray cluster of the embedded pool `local`."""

    model_config = SettingsConfigDict(env_prefix="RELAX_RAY_", extra="ignore")

    address: str | None = Field(
        None,
        description="Ray dashboard (Jobs API) address of pool `local`, e.g. http://10.0.0.5:8265. "
        "Default: the embedded platform starts a local Ray head.",
    )
    num_cpus: int | None = Field(None, description="CPUs the embedded Ray head advertises.")
    local_slots: int | None = Field(
        None,
        description="Slots of pool `local` on a machine without GPUs (one slot stands for one GPU). "
        "Default: the number of CPU cores, at least 2.",
    )
    token_dir: Path | None = Field(
        None,
        description="Directory of the pools' Ray auth tokens, one file per pool named after it (mode "
        "0600), sent as `Authorization: Bearer` to the pool's Ray Jobs API. The embedded platform "
        "creates the file of pool `local` and starts its Ray head with it; for a pool on an external "
        "Ray cluster, put that cluster's token (`RAY_AUTH_TOKEN_PATH` of its `ray start`) there. "
        "Default: $RELAX_HOME/ray_tokens.",
    )


class WebhookSettings(BaseSettings):
    """Delivery of webhooks (docs/reference/webhooks.md)."""

    model_config = SettingsConfigDict(env_prefix="RELAX_WEBHOOK_", extra="ignore")

    retry_seconds: list[float] = Field(
        [5.0, 30.0, 120.0, 600.0, 3600.0, 10800.0, 21600.0],
        min_length=0,
        max_length=20,
        description="Waits between a webhook's attempts, in order (RELAX_WEBHOOK_RETRY_SECONDS, a JSON list): "
        "a message is tried once, then once after each wait, then marked failed. Default: 5 s, 30 s, 2 min, "
        "10 min, 1 h, 3 h, 6 h (8 attempts over ~10 h).",
    )
    timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="How long one attempt waits for the receiver's answer."
    )
    allow_private_addresses: bool = Field(
        False,
        description="Let webhooks reach loopback, private and link-local addresses "
        "(RELAX_WEBHOOK_ALLOW_PRIVATE_ADDRESSES). Off by default: a URL is a team's input, and must not reach "
        "the platform's own network (its database, a cloud's metadata service).",
    )
    max_endpoints_per_team: int = Field(20, ge=1, le=1000, description="Webhook endpoints a team may have.")
    threads: int = Field(
        4,
        ge=1,
        le=64,
        description="Threads of each worker process that make webhook attempts (apart from the worker's own, so that "
        "slow receivers never hold up launches and reconciles).",
    )
    retention_days: float = Field(
        30.0,
        gt=0,
        description="How long the delivery log keeps a delivered or failed message (RELAX_WEBHOOK_RETENTION_DAYS); "
        "the beat's tick removes older ones.",
    )
    sweep_batch: int = Field(
        200, ge=1, le=10000, description="Due deliveries the beat's tick sends tasks for, at most, each tick."
    )


class FileSettings(BaseSettings):
    """Files uploaded over HTTP (`/v1/files`, `/v1/uploads`; docs/reference/files.md)."""

    model_config = SettingsConfigDict(env_prefix="RELAX_FILES_", extra="ignore")

    store: Literal["local", "s3"] = Field(
        "local",
        description="Where the bytes live (RELAX_FILES_STORE): `local`, the team's area under the artifact root "
        "(`<area>/files/<id>/`); `s3`, an S3-compatible bucket (needs the `s3` extra: boto3), materialised into "
        "the team's area when a job refers to a file.",
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO, Ceph, …); unset: AWS.")
    s3_bucket: str | None = Field(None, description="The bucket (must exist).")
    s3_prefix: str = Field("relax/", max_length=200, description="Key prefix of every object.")
    s3_region: str | None = Field(None, description="The bucket's region.")
    s3_access_key_id: str | None = Field(None, repr=False, description="Unset: boto3's own chain.")
    s3_secret_access_key: str | None = Field(None, repr=False)
    team_quota_bytes: int = Field(
        100 * 1024**3,
        ge=0,
        description="Bytes a team may keep in files (RELAX_FILES_TEAM_QUOTA_BYTES), unpacked models and "
        "uploads in progress included; an upload past it is refused with 413.",
    )
    max_file_bytes: int = Field(
        512 * 1024**2, ge=1, description="Largest file of one `POST /v1/files`; larger ones use /v1/uploads."
    )
    max_part_bytes: int = Field(64 * 1024**2, ge=1, description="Largest part of an upload.")
    max_upload_bytes: int = Field(
        64 * 1024**3, ge=1, description="Largest file of an upload in parts (/v1/uploads)."
    )
    upload_expiry_seconds: float = Field(
        24 * 3600.0, gt=0, description="An upload not completed within this is expired, its parts removed."
    )
    max_archive_entries: int = Field(
        100_000, ge=1, description="Most entries of a model archive (tar or zip) unpacked into a folder."
    )
    max_unpacked_bytes: int = Field(
        256 * 1024**3, ge=1, description="Most bytes a model archive may unpack to (and the team's quota)."
    )


class Settings(BaseSettings):
    """All platform settings. Build with get_settings(); never at import time."""

    model_config = SettingsConfigDict(env_prefix="RELAX_", extra="ignore")

    home: Path = Field(default_factory=_home, description="Directory of the embedded platform's state.")
    artifact_root: Path | None = Field(
        None, description="Where job outputs, models and datasets live. Default: $RELAX_HOME/artifacts."
    )
    secret_key: str | None = Field(
        None,
        repr=False,
        description="Signs job tokens. Default: a random key kept in $RELAX_HOME/secret.key.",
    )
    environment: str = Field("dev", description="dev or production; production refuses defaults.")

    api: ApiSettings = Field(default_factory=ApiSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    celery: CelerySettings = Field(default_factory=CelerySettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    files: FileSettings = Field(default_factory=FileSettings)

    @model_validator(mode="after")
    def _production_needs_real_services(self) -> Settings:
        if self.environment == "production":
            missing = [
                name
                for name, value in (
                    ("RELAX_DATABASE_URL", self.database.url),
                    ("RELAX_BROKER_URL", self.celery.broker_url),
                    ("RELAX_SECRET_KEY", self.secret_key),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"production needs {', '.join(missing)} set")
        return self

    # Derived values -------------------------------------------------------------------------
    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.home / 'relax.db'}"

    @property
    def broker_url(self) -> str:
        return self.celery.broker_url or f"sqla+sqlite:///{self.home / 'broker.db'}"

    @property
    def artifacts(self) -> Path:
        return (self.artifact_root or self.home / "artifacts").resolve()

    @property
    def public_url(self) -> str:
        return self.api.public_url or f"http://{self.api.host}:{self.api.port}"

    def signing_key(self) -> bytes:
        """The job-token signing key; created once in $RELAX_HOME (0600, atomically) when not configured.
        Registered with the log redaction, so that it never appears in this process's logs."""
        from runtime.redaction import register_secret
        from scheduler.secret_files import create_secret_file, read_secret_file

        if self.secret_key:
            register_secret(self.secret_key)
            return self.secret_key.encode()
        path = self.home / "secret.key"
        if not path.exists():
            create_secret_file(path, secrets.token_hex(32))  # the first process to create it wins
        key = read_secret_file(path)
        register_secret(key)
        return key.encode()

    # Ray auth tokens, one per pool ---------------------------------------------------------------
    def ray_token_path(self, pool: str) -> Path:
        """Where the Ray auth token of `pool` lives (the file need not exist)."""
        if not _POOL_FILE_NAME.fullmatch(pool):
            raise ValueError(f"{pool!r} is not a pool name")
        return (self.ray.token_dir or self.home / "ray_tokens") / pool

    def ray_token(self, pool: str) -> str | None:
        """The Ray auth token of `pool`, or None when it has none (its Ray then runs without auth and
        refuses nothing, or refuses the platform's calls with 401 until an admin puts the token there).
        Registered with the log redaction: it never appears in this process's logs."""
        from runtime.redaction import register_secret
        from scheduler.secret_files import read_secret_file

        path = self.ray_token_path(pool)
        if not path.exists():
            return None
        token = read_secret_file(path) or None
        register_secret(token)
        return token

    def ensure_ray_token(self, pool: str) -> Path:
        """The token file of `pool`, created (0600, atomically, 256 random bits) if missing."""
        from scheduler.secret_files import create_secret_file

        path = self.ray_token_path(pool)
        if not path.exists():
            create_secret_file(path, secrets.token_hex(32))  # the first process to create it wins
        return path


@lru_cache
def get_settings() -> Settings:
    return Settings()
