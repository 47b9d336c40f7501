"""What a rule is and what it sees.

A rule has a stable code (``rule.<name>``), the flags it involves, a one-line summary, and a function that
reads the field values and reports through the context: `ctx.error` / `ctx.warn` for problems, `ctx.derive`
to fill a derived default (recorded in `NormalizedSpec.derived`). `@rule(...)` makes a `Rule` of the function
below it; the rule runs only where `jobspec.rules` lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobspec.issues import SpecIssue
from jobspec.spec import FIELDS


@dataclass(frozen=True)
class Rule:
    code: str
    fields: tuple[str, ...]  # Relax flags (hyphenated)
    summary: str
    fn: Callable[[RuleContext], None]
    # Why this rule deliberately differs from Relax's code (None: it does what Relax's code does).
    deviation: str | None = None


class RuleContext:
    """What a rule sees: field values (by name), which ones the user gave, and the report sinks."""

    def __init__(self, values: dict[str, Any], explicit: set[str], max_gpus_per_node: int | None = None):
        self.values = values
        self.explicit = explicit
        self.max_gpus_per_node = max_gpus_per_node
        self.issues: list[SpecIssue] = []
        self.derived: dict[str, Any] = {}
        self._rule: Rule | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    # -- reporting --------------------------------------------------------------------------
    def _issue(
        self, severity: str, message: str, hint: str, fields: tuple[str, ...] | None, code: str | None
    ):
        assert self._rule is not None
        flags = list(fields or self._rule.fields)
        self.issues.append(
            SpecIssue(
                code=code or self._rule.code,
                field=flags[0] if flags else None,
                message=message,
                hint=hint,
                severity=severity,  # type: ignore[arg-type]
                fields=flags,
            )
        )

    def error(
        self, message: str, hint: str, *, fields: tuple[str, ...] | None = None, code: str | None = None
    ):
        self._issue("error", message, hint, fields, code)

    def warn(
        self, message: str, hint: str, *, fields: tuple[str, ...] | None = None, code: str | None = None
    ):
        self._issue("warning", message, hint, fields, code)

    def derive(self, name: str, value: Any) -> None:
        """Set a derived default and record it."""
        self.values[name] = value
        self.derived[name] = value

    def given(self, name: str) -> bool:
        """True when the user set this field (even to its default value)."""
        return name in self.explicit

    def non_default(self, name: str) -> bool:
        return self.values[name] != FIELDS[name].default

    @property
    def is_sft(self) -> bool:
        return self.values["loss_type"] == "sft"

    @property
    def is_ppo(self) -> bool:
        return self.values["advantage_estimator"] == "ppo"

    @property
    def megatron(self) -> bool:
        """The megatron backend: Relax's `_set_default_megatron_args` applies (relax/backends/megatron)."""
        return self.values["train_backend"] == "megatron"

    @property
    def megatron_validates(self) -> bool:
        """Megatron's `validate_args` runs: the megatron backend, unless --debug-rollout-only (Relax skips it)."""
        return self.megatron and not self.values["debug_rollout_only"]


def rule(
    code: str, *flags: str, summary: str, deviation: str | None = None
) -> Callable[[Callable[[RuleContext], None]], Rule]:
    """Make a `Rule` of the function below (its name is the code without ``rule.``).

    deviation: why the rule deliberately differs from Relax's code (it refuses what Relax's code accepts,
    or accepts what it refuses); every deviation is listed in the generated reference (`deviations()`).
    """

    def decorate(fn: Callable[[RuleContext], None]) -> Rule:
        if deviation is not None and not deviation.strip():
            raise ValueError(f"rule {code}: a deviation needs its reason")
        return Rule(code=code, fields=flags, summary=summary, fn=fn, deviation=deviation)

    return decorate


def cli_flags(*names: str) -> str:
    """The flags of these fields, for a message: ``--a, --b``."""
    return ", ".join(f"--{FIELDS[n].flag}" for n in names)
