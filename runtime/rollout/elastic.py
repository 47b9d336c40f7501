"""Elastic rollout (`--autoscaler-config`, `--scale-out-*`, `--scale-in-*`) as pure logic: the settings of a
scale-out or scale-in, when to scale (the autoscaler's thresholds, in a standalone run) and which engines to
stop and start to follow what the scheduling pass granted (a job the platform placed). The autoscaler's YAML
is `jobspec.autoscaler` (the platform reads its bounds at submission); the Ray side (starting engines,
loading the current weights, draining and stopping engines) is `runtime.roles.elastic`.

Relax's defaults for the operation flags: `--scale-out-timeout` 300 s for the whole scale-out (engine
start, connect, weight sync, health); `--scale-out-partial-success-policy` rollback_all (any engine that
fails undoes the scale-out) or keep_partial (the engines that came up stay); `--scale-in-drain-timeout`
30 s for an engine's in-flight requests before they are aborted; `--scale-in-shutdown-timeout` 30 s for
an engine's graceful shutdown before its actor is killed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jobspec.autoscaler import AutoscalerConfig, AutoscalerConfigError, ScaleRule
from runtime.report_protocol import RolloutWish

__all__ = [
    "Autoscaler",
    "AutoscalerConfig",
    "AutoscalerConfigError",
    "ElasticSettings",
    "FollowPlan",
    "PartialSuccessPolicy",
    "RolloutWish",
    "ScaleRule",
    "follow_grant",
    "settle_scale_out",
]

DEFAULT_SCALE_OUT_TIMEOUT_S = 300.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


class PartialSuccessPolicy(StrEnum):
    ROLLBACK_ALL = "rollback_all"
    KEEP_PARTIAL = "keep_partial"


@dataclass(frozen=True)
class ElasticSettings:
    """The job's elastic rollout: its autoscaler and the scale operations' flags."""

    autoscaler: AutoscalerConfig
    scale_out_timeout_s: float = DEFAULT_SCALE_OUT_TIMEOUT_S
    partial_success: PartialSuccessPolicy = PartialSuccessPolicy.ROLLBACK_ALL
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S

    def __post_init__(self) -> None:
        for flag, value in (
            ("scale-out-timeout", self.scale_out_timeout_s),
            ("scale-in-drain-timeout", self.drain_timeout_s),
            ("scale-in-shutdown-timeout", self.shutdown_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"--{flag} must be > 0 seconds, got {value}")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ElasticSettings | None:
        """None unless `autoscaler_config` is set (then its YAML is read here: a path on this machine)."""
        path = values.get("autoscaler_config")
        if not path:
            return None

        def number(key: str, default: float) -> float:
            value = values.get(key)
            return default if value is None else float(value)

        policy = values.get("scale_out_partial_success_policy") or PartialSuccessPolicy.ROLLBACK_ALL.value
        try:
            partial = PartialSuccessPolicy(policy)
        except ValueError:
            raise ValueError(
                f"--scale-out-partial-success-policy {policy!r}: one of rollback_all, keep_partial"
            ) from None
        return cls(
            autoscaler=AutoscalerConfig.load(path),
            scale_out_timeout_s=number("scale_out_timeout", DEFAULT_SCALE_OUT_TIMEOUT_S),
            partial_success=partial,
            drain_timeout_s=number("scale_in_drain_timeout", DEFAULT_DRAIN_TIMEOUT_S),
            shutdown_timeout_s=number("scale_in_shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT_S),
        )


class Autoscaler:
    """When to scale, step by step: the rollout's share of each step's wall time against the thresholds,
    every `evaluation_interval` steps, not within a rule's cooldown of the last scaling, within
    [min_engines, max_engines]. A standalone run scales to `target` at once; a job the platform placed asks the
    scheduling pass for it instead (`ask`), starting from `wish` engines (its spec's count)."""

    def __init__(self, config: AutoscalerConfig, wish: int | None = None) -> None:
        self.config = config
        self.last_scaled: int | None = None
        # the engines asked of the scheduling pass (`ask`); the spec's count (what the pass grants before any)
        self.wish = None if wish is None else min(max(wish, config.min_engines), config.max_engines)

    def target(self, step: int, engines: int, rollout_share: float) -> int:
        """How many engines to run from the next step on (`engines`: none to change). Outside the
        bounds (the role started with another count) it first comes back within them."""
        c = self.config
        if engines < c.min_engines or engines > c.max_engines:
            return min(max(engines, c.min_engines), c.max_engines)
        if (step + 1) % c.evaluation_interval:
            return engines
        since = None if self.last_scaled is None else step - self.last_scaled
        if rollout_share > c.scale_out.threshold and engines < c.max_engines:
            if since is None or since >= c.scale_out.cooldown_steps:
                return min(c.max_engines, engines + c.scale_out.step)
        elif rollout_share < c.scale_in.threshold and engines > c.min_engines:
            if since is None or since >= c.scale_in.cooldown_steps:
                return max(c.min_engines, engines - c.scale_in.step)
        return engines

    def scaled(self, step: int) -> None:
        self.last_scaled = step

    def ask(self, step: int, engines: int, rollout_share: float) -> RolloutWish | None:
        """On the platform: the engines to ask the scheduling pass for from the next step on, decided by `target`
        on the `engines` the role runs now, as a standalone run decides; None when the wish stays. The wish moves
        only the way the step points: a rollout-bound step never lowers it (the pass may have taken back engines
        the job still wants, for another job), a step where the engines wait never raises it. A new wish counts
        as a scaling for the cooldowns."""
        current = engines if self.wish is None else self.wish
        target = self.target(step, engines, rollout_share)
        if target > engines:
            wish = max(current, target)
        elif target < engines:
            wish = min(current, target)
        else:
            return None
        if wish == current:
            return None
        c = self.config
        within = c.min_engines <= engines <= c.max_engines
        rule = c.scale_out if target > engines else c.scale_in
        self.wish = wish
        self.scaled(step)
        return RolloutWish(
            step=step, engines=wish, share=rollout_share, threshold=rule.threshold if within else None
        )


def settle_scale_out(ok: list[bool], policy: PartialSuccessPolicy) -> list[bool]:
    """Which of the new engines stay: all that came up, unless one failed under rollback_all (then none)."""
    if policy is PartialSuccessPolicy.ROLLBACK_ALL and not all(ok):
        return [False] * len(ok)
    return list(ok)


@dataclass(frozen=True)
class FollowPlan:
    """How the engines follow a grant: which of them stay and which leave (indexes into the role's engines,
    oldest first), and the Ray node of each engine to start (None: wherever Ray has room)."""

    keep: tuple[int, ...]
    leave: tuple[int, ...]
    start: tuple[str | None, ...]

    @property
    def changes(self) -> bool:
        return bool(self.leave or self.start)


def follow_grant(engines: Sequence[str | None], granted: Sequence[str | None]) -> FollowPlan:
    """The fewest engine stops and starts that make the engines' nodes (`engines`: the Ray node each runs on)
    the grant's (`granted`: one Ray node per engine the scheduling pass allocated the job). An engine stays
    where the grant has a replica on its node (the oldest first), the others leave; each replica left over
    is an engine to start on its node. The pass may take back any replica, not only the newest, and only the
    engine on that node frees the GPU it gave to another job. An empty grant changes nothing (a job always
    keeps an engine)."""
    if not granted:
        return FollowPlan(tuple(range(len(engines))), (), ())
    wanted = Counter(granted)
    keep: list[int] = []
    leave: list[int] = []
    for index, node in enumerate(engines):
        if wanted[node] > 0:
            wanted[node] -= 1
            keep.append(index)
        else:
            leave.append(index)
    start: list[str | None] = []
    for node in granted:
        if wanted[node] > 0:
            wanted[node] -= 1
            start.append(node)
    return FollowPlan(tuple(keep), tuple(leave), tuple(start))
