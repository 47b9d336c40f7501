"""The autoscaler YAML of elastic rollout (`--autoscaler-config`), read once for the platform and the driver:
the scheduler reads its engine bounds at submission (the rollout gang's `min_replicas` / `max_replicas`,
`jobspec.demand.elastic_rollout`), the driver its thresholds (`runtime.rollout.elastic`).

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

Every key is checked; an unknown one is refused with the nearest known one (docs/reference/elastic-rollout.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

__all__ = ["AutoscalerConfig", "AutoscalerConfigError", "MAX_AUTOSCALER_CONFIG_BYTES", "ScaleRule"]

#: The most bytes of an autoscaler YAML the platform reads at submission (a few hundred is usual).
MAX_AUTOSCALER_CONFIG_BYTES = 64 * 1024


class AutoscalerConfigError(ValueError):
    """The autoscaler YAML is unreadable or wrong: the message names the key and says what fits."""


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
    def parse_text(cls, text: str, *, source: str = "--autoscaler-config") -> AutoscalerConfig:
        """From the YAML's text (`parse`); text that is not YAML raises `AutoscalerConfigError` too."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AutoscalerConfigError(f"{source}: not YAML ({exc})") from exc
        return cls.parse(data, source=source)

    @classmethod
    def load(cls, path: str | Path) -> AutoscalerConfig:
        """From the file at `path` (the driver's copy of the path the platform resolved at submission)."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise AutoscalerConfigError(f"--autoscaler-config {path}: cannot be read ({exc})") from exc
        return cls.parse_text(text, source=f"--autoscaler-config {path}")


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
