"""Rollout engine health (`--use-health-check`): when to probe the engines, what a probe's answer means, and
how many replacements a job may make. Pure logic and one HTTP probe; the Ray side (killing a lost engine,
starting its replacement on the role's capacity, loading the current weights, retrying its requests) is
`runtime.roles.engine_health`.

Relax's flags: `--rollout-health-check-first-wait` seconds after the engines are up, then every
`--rollout-health-check-interval` seconds, each engine's `/health_generate` (SGLang's probe; ours answers
200 at once while the engine is busy or its memory is released on purpose) is asked, with
`--rollout-health-check-timeout` seconds to answer. No answer in time: the engine is HUNG (e.g. its process
is stopped); a refused connection: DEAD (its process, actor or node is gone); any other status than 200:
UNHEALTHY. Each is replaced, and every replacement counts against `--max-global-restart`: the one past it
fails the job, naming the engine and the count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

HEALTH_ENDPOINT = "/health_generate"

# Relax's defaults (configuration: --rollout-health-check-*, --max-global-restart)
DEFAULT_INTERVAL_S = 30.0
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_FIRST_WAIT_S = 0.0
DEFAULT_MAX_RESTARTS = 3


class Verdict(StrEnum):
    HEALTHY = "healthy"
    HUNG = "hung"  # no answer within the timeout
    DEAD = "dead"  # nothing listens (the server, its actor or its node is gone), or its actor died
    UNHEALTHY = "unhealthy"  # answered, but not 200


@dataclass(frozen=True)
class HealthCheckConfig:
    """The job's health-check settings (`from_values` reads them from the spec's values)."""

    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    first_wait_s: float = DEFAULT_FIRST_WAIT_S
    max_restarts: int = DEFAULT_MAX_RESTARTS

    def __post_init__(self) -> None:
        for name, value, low in (
            ("rollout-health-check-interval", self.interval_s, 0.0),
            ("rollout-health-check-timeout", self.timeout_s, 0.0),
        ):
            if not value > low:
                raise ValueError(f"--{name} must be > 0 seconds, got {value}")
        if self.first_wait_s < 0:
            raise ValueError(
                f"--rollout-health-check-first-wait must be >= 0 seconds, got {self.first_wait_s}"
            )
        if self.max_restarts < 0:
            raise ValueError(f"--max-global-restart must be >= 0, got {self.max_restarts}")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> HealthCheckConfig | None:
        """None unless `use_health_check` is set; Relax's defaults for what the values leave out."""
        if not values.get("use_health_check"):
            return None

        def number(key: str, default: float) -> float:
            value = values.get(key)
            return default if value is None else float(value)

        return cls(
            interval_s=number("rollout_health_check_interval", DEFAULT_INTERVAL_S),
            timeout_s=number("rollout_health_check_timeout", DEFAULT_TIMEOUT_S),
            first_wait_s=number("rollout_health_check_first_wait", DEFAULT_FIRST_WAIT_S),
            max_restarts=int(number("max_global_restart", DEFAULT_MAX_RESTARTS)),
        )


class RestartBudgetExceeded(RuntimeError):
    """A replacement past `--max-global-restart`: the job fails with this."""

    def __init__(self, engine_index: int, reason: str, replacements: int, max_restarts: int) -> None:
        self.engine_index = engine_index
        self.replacements = replacements
        self.max_restarts = max_restarts
        super().__init__(
            f"rollout engine {engine_index} is {reason} and would be replacement {replacements} of this run, "
            f"past --max-global-restart={max_restarts}: giving up (raise --max-global-restart, or find why "
            "the engines fail)"
        )


class HealthMonitor:
    """The decisions, on a clock the caller passes (seconds, monotonic): when a probe round is due, which
    engines a round's verdicts condemn, and the restart budget. Engines are known by index."""

    def __init__(self, config: HealthCheckConfig, *, started_at: float) -> None:
        self.config = config
        self.started_at = started_at
        self.last_round: float | None = None
        self.replacements = 0
        self.per_engine: dict[int, int] = {}

    def next_round_at(self) -> float:
        first = self.started_at + self.config.first_wait_s
        if self.last_round is None:
            return first
        return max(first, self.last_round + self.config.interval_s)

    def due(self, now: float) -> bool:
        return now >= self.next_round_at()

    def round_started(self, now: float) -> None:
        self.last_round = now

    @staticmethod
    def condemned(verdicts: Mapping[int, Verdict]) -> dict[int, Verdict]:
        """The engines a round's verdicts say to replace (every one not HEALTHY), in index order."""
        return {i: v for i, v in sorted(verdicts.items()) if v is not Verdict.HEALTHY}

    def charge(self, engine_index: int, reason: str) -> int:
        """Count one replacement of `engine_index`; its number in this run. Past the budget: raises
        `RestartBudgetExceeded` (and counts nothing)."""
        number = self.replacements + 1
        if number > self.config.max_restarts:
            raise RestartBudgetExceeded(engine_index, reason, number, self.config.max_restarts)
        self.replacements = number
        self.per_engine[engine_index] = self.per_engine.get(engine_index, 0) + 1
        return number


def classify(status: int | None, error: BaseException | None) -> Verdict:
    """A probe's outcome as a verdict: `status` the HTTP status (None: no response), `error` what the
    request raised."""
    if error is not None:
        if isinstance(error, httpx.TimeoutException):
            return Verdict.HUNG  # no answer in time: a stopped or wedged process, or an unreachable node
        return Verdict.DEAD  # refused, reset: nothing serves there any more
    return Verdict.HEALTHY if status == 200 else Verdict.UNHEALTHY


def probe(address: str, *, api_key: str | None, timeout_s: float) -> Verdict:
    """Ask one engine server's `/health_generate` (with the job's engine secret), `timeout_s` to answer."""
    from runtime.rollout.sglang.client import auth_headers, engine_url

    try:
        response = httpx.get(
            f"{engine_url(address)}{HEALTH_ENDPOINT}", headers=auth_headers(api_key), timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return classify(None, exc)
    return classify(response.status_code, None)
