"""Elastic rollout (`--autoscaler-config`, `--scale-out-*`, `--scale-in-*`): the autoscaler's YAML, the
settings of a scale-out or scale-in, and the decisions, as pure logic. The Ray side (starting engines,
loading the current weights, draining and stopping engines) is `runtime.roles.elastic`.

The YAML (docs/reference/elastic-rollout.md has it with each key's meaning; unknown keys are refused):

    min_engines: 1          # the fewest rollout engines (>= 1)
    max_engines: 4          # the most (>= min_engines)
    evaluation_interval: 1  # rollout steps between two decisions
    scale_out:
      threshold: 0.6        # add engines when the rollout takes more than this share of a step ...
      step: 1               # ... this many at once
      cooldown_steps: 2     # steps after any scaling before the next scale-out
    scale_in:
      threshold: 0.2        # remove engines when the rollout takes less than this share of a step
      step: 1
      cooldown_steps: 2

Relax's defaults for the operation flags: `--scale-out-timeout` 300 s for the whole scale-out (engine
start, connect, weight sync, health); `--scale-out-partial-success-policy` rollback_all (any engine that
fails undoes the scale-out) or keep_partial (the engines that came up stay); `--scale-in-drain-timeout`
30 s for an engine's in-flight requests before they are aborted; `--scale-in-shutdown-timeout` 30 s for
an engine's graceful shutdown before its actor is killed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

DEFAULT_SCALE_OUT_TIMEOUT_S = 300.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


class AutoscalerConfigError(ValueError):
    """The autoscaler YAML is unreadable or wrong: the message names the key and says what fits."""


class PartialSuccessPolicy(StrEnum):
    ROLLBACK_ALL = "rollback_all"
    KEEP_PARTIAL = "keep_partial"


@dataclass(frozen=True)
class ScaleRule:
    """One direction's rule: scale by `step` engines when the rollout's share of the step's time is past
    `threshold`, at least `cooldown_steps` steps after the last scaling."""

    threshold: float
    step: int = 1
    cooldown_steps: int = 2


@dataclass(frozen=True)
class AutoscalerConfig:
    min_engines: int
    max_engines: int
    evaluation_interval: int = 1
    scale_out: ScaleRule = ScaleRule(threshold=0.6)
    scale_in: ScaleRule = ScaleRule(threshold=0.2)

    @classmethod
    def parse(cls, data: Any, *, source: str = "--autoscaler-config") -> AutoscalerConfig:
        """From the YAML's mapping; every problem raises `AutoscalerConfigError` naming the key."""
        if not isinstance(data, Mapping):
            raise AutoscalerConfigError(f"{source}: a mapping of keys is expected, got {type(data).__name__}")
        top = _known(data, cls, source)
        for key in ("min_engines", "max_engines"):
            if key not in top:
                raise AutoscalerConfigError(f"{source}: {key} is required (an integer >= 1)")
        low = _integer(top["min_engines"], f"{source}: min_engines", 1)
        high = _integer(top["max_engines"], f"{source}: max_engines", 1)
        if high < low:
            raise AutoscalerConfigError(f"{source}: max_engines ({high}) must be >= min_engines ({low})")
        rules = {}
        for key, default in (("scale_out", ScaleRule(0.6)), ("scale_in", ScaleRule(0.2))):
            raw = top.get(key, {})
            if not isinstance(raw, Mapping):
                raise AutoscalerConfigError(
                    f"{source}: {key} must be a mapping (threshold, step, cooldown_steps)"
                )
            given = _known(raw, ScaleRule, f"{source}: {key}")
            rules[key] = ScaleRule(
                threshold=_share(given.get("threshold", default.threshold), f"{source}: {key}.threshold"),
                step=_integer(given.get("step", default.step), f"{source}: {key}.step", 1),
                cooldown_steps=_integer(
                    given.get("cooldown_steps", default.cooldown_steps), f"{source}: {key}.cooldown_steps", 0
                ),
            )
        if rules["scale_in"].threshold >= rules["scale_out"].threshold:
            raise AutoscalerConfigError(
                f"{source}: scale_in.threshold ({rules['scale_in'].threshold}) must be below "
                f"scale_out.threshold ({rules['scale_out'].threshold}), or every step would scale one way or "
                "the other"
            )
        return cls(
            min_engines=low,
            max_engines=high,
            evaluation_interval=_integer(
                top.get("evaluation_interval", 1), f"{source}: evaluation_interval", 1
            ),
            **rules,
        )

    @classmethod
    def load(cls, path: str | Path) -> AutoscalerConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise AutoscalerConfigError(f"--autoscaler-config {path}: cannot be read ({exc})") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AutoscalerConfigError(f"--autoscaler-config {path}: not YAML ({exc})") from exc
        return cls.parse(data, source=f"--autoscaler-config {path}")


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
    [min_engines, max_engines]."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self.last_scaled: int | None = None

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


def settle_scale_out(ok: list[bool], policy: PartialSuccessPolicy) -> list[bool]:
    """Which of the new engines stay: all that came up, unless one failed under rollback_all (then none)."""
    if policy is PartialSuccessPolicy.ROLLBACK_ALL and not all(ok):
        return [False] * len(ok)
    return list(ok)


def _known(data: Mapping[str, Any], kind: type, where: str) -> dict[str, Any]:
    names = [f.name for f in fields(kind)]
    out = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(names)}"
            raise AutoscalerConfigError(f"{where}: unknown key {key!r} ({hint})")
        out[key] = value
    return out


def _integer(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise AutoscalerConfigError(f"{where} must be an integer >= {low}, got {value!r}")
    return value


def _share(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise AutoscalerConfigError(f"{where} must be a share of the step's time in [0, 1], got {value!r}")
    return float(value)
