"""What a rule is and what it sees.

A rule has a stable code (``rule.<name>``), the flags it involves, a one-line summary, and a function that
reads the field values and reports through the context: `ctx.error` / `ctx.warn` for problems, `ctx.derive`
to fill a derived default (recorded in `NormalizedSpec.derived`). `@rule(...)` makes a `Rule` of the function
below it; the rule runs only where `jobspec.rules` lists it.

Shared pieces: `ctx.warn_ignored(ctx.non_defaults(...), "<flag>")` for options that only apply with a switch,
`ctx.turn_on(...)` for switches a rule derives on, and rules that are only one such check, made by one call:
`options_need` (options that need a switch, a warning), `requires` (``--flag needs --other``), `value_needs`
(``--flag value needs --other``), `exclusive` (two flags that cannot both be set), `implies` (``--flag turns
on --switch``) and `defaults_to` (``--flag defaults to --source``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobspec.issues import SpecIssue
from jobspec.spec import FIELDS, FIELDS_BY_FLAG


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

    def turn_on(self, *names: str) -> None:
        """Derive true for those of these fields (switches) that are off."""
        for name in names:
            if not self.values[name]:
                self.derive(name, True)

    def given(self, name: str) -> bool:
        """True when the user set this field (even to its default value)."""
        return name in self.explicit

    def non_default(self, name: str) -> bool:
        return self.values[name] != FIELDS[name].default

    def non_defaults(self, *names: str) -> list[str]:
        """Those of these fields whose value is not their default, in the order given."""
        return [n for n in names if self.non_default(n)]

    def warn_unless(self, needs: str, *names: str, **how: Any) -> None:
        """`warn_ignored` for those of `names` (fields) not at their default, unless the flag --`needs` is on;
        `how`: warn_ignored's why, hint, rule_fields."""
        if not self.values[FIELDS_BY_FLAG[needs]]:
            self.warn_ignored(self.non_defaults(*names), needs, **how)

    def warn_ignored(
        self,
        used: list[str],
        needs: str,
        *,
        why: str | None = None,
        hint: str | None = None,
        rule_fields: bool = False,
    ) -> None:
        """Warn, when `used` (field names) is not empty, that those options are ignored without --`needs`.

        why: what the message says of them (``only apply with --<needs>``); hint: ``add --<needs>``. The issue
        names `needs` and then the used flags, or with `rule_fields` the rule's own flags.
        """
        if used:
            self.warn(
                f"{cli_flags(*used)} {why or f'only apply with --{needs}'}",
                hint or f"add --{needs}",
                fields=None if rule_fields else (needs, *flags_of(*used)),
            )

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


def flags_of(*names: str) -> tuple[str, ...]:
    """The flags of these fields, for an issue's `fields`: ``("a", "b")``."""
    return tuple(FIELDS[n].flag for n in names)


def exclusive(
    code: str,
    a: str,
    b: str,
    *,
    message: str,
    summary: str,
    hint: str = "keep one of them",
    a_is: str | None = None,
    rl_only: bool = False,
    deviation: str | None = None,
) -> Rule:
    """A rule that refuses flags `a` and `b` set together: the error `message` with `hint`.

    a_is: `a` counts as set when it is this value (``--a a_is`` and `b` cannot be combined).
    rl_only: an SFT job is not checked (the flags mean nothing there).
    """
    a_name, b_name = FIELDS_BY_FLAG[a], FIELDS_BY_FLAG[b]

    def refuse_both(ctx: RuleContext) -> None:
        a_set = ctx.values[a_name] if a_is is None else ctx.values[a_name] == a_is
        if not (rl_only and ctx.is_sft) and a_set and ctx.values[b_name]:
            ctx.error(message, hint)

    return rule(code, a, b, summary=summary, deviation=deviation)(refuse_both)


def requires(
    code: str,
    flag: str,
    needed: str,
    *,
    summary: str,
    message: str | None = None,
    hint: str | None = None,
    warn: bool = False,
) -> Rule:
    """A rule for flag `flag` set while flag `needed` is not (both read as true or false): the error
    `message` (``--flag needs --needed``), or with `warn` a warning; `hint`: ``add --needed``."""
    flag_name, needed_name = FIELDS_BY_FLAG[flag], FIELDS_BY_FLAG[needed]
    report_message = message or f"--{flag} needs --{needed}"
    report_hint = hint or f"add --{needed}"

    def report_missing(ctx: RuleContext) -> None:
        if ctx.values[flag_name] and not ctx.values[needed_name]:
            (ctx.warn if warn else ctx.error)(report_message, report_hint)

    return rule(code, flag, needed, summary=summary)(report_missing)


def value_needs(
    code: str,
    flag: str,
    value: str,
    needed: str,
    *,
    summary: str,
    hint: str,
    ignored_hint: str | None = None,
    sft_only: bool = False,
    deviation: str | None = None,
) -> Rule:
    """A rule for ``--flag value`` without `needed` (unset: None): the error ``--flag value needs --needed``
    with `hint`. With `ignored_hint`, `needed` set while --flag is another value is a warning that it is
    ignored. sft_only: only a job of --loss-type sft is checked."""
    flag_name, needed_name = FIELDS_BY_FLAG[flag], FIELDS_BY_FLAG[needed]

    def check_pair(ctx: RuleContext) -> None:
        if sft_only and not ctx.is_sft:
            return
        current, given = ctx.values[flag_name], ctx.values[needed_name]
        if current == value and given is None:
            ctx.error(f"--{flag} {value} needs --{needed}", hint)
        elif ignored_hint is not None and current != value and given is not None:
            ctx.warn(f"--{needed} is ignored with --{flag} {current}", ignored_hint)

    return rule(code, flag, needed, summary=summary, deviation=deviation)(check_pair)


def implies(code: str, flag: str, target: str, *, summary: str, value: Any = None) -> Rule:
    """A rule that turns on the switch `target` (derived) while flag `flag` is set, or with `value`, is it."""
    flag_name, target_name = FIELDS_BY_FLAG[flag], FIELDS_BY_FLAG[target]

    def turn_on_target(ctx: RuleContext) -> None:
        current = ctx.values[flag_name]
        if current if value is None else current == value:
            ctx.turn_on(target_name)

    return rule(code, flag, target, summary=summary)(turn_on_target)


def options_need(
    code: str,
    needs: str,
    *names: str,
    summary: str,
    flags: tuple[str, ...] | None = None,
    **how: Any,
) -> Rule:
    """A rule that warns of options (`names`, fields) set off their default while the switch --`needs` is off:
    `ctx.warn_unless(needs, *names, **how)` (how: warn_ignored's why, hint, rule_fields).

    The rule's flags are `needs` and the options' flags, or `flags` where given.
    """

    def warn_unused(ctx: RuleContext) -> None:
        ctx.warn_unless(needs, *names, **how)

    return rule(code, *(flags or (needs, *flags_of(*names))), summary=summary)(warn_unused)


def defaults_to(code: str, target: str, source: str, *, only_if_set: bool = False) -> Rule:
    """A rule that derives an unset `target` (a flag) from `source`'s value: ``--target defaults to --source``.

    only_if_set: derive nothing while `source` is unset too (None).
    """
    target_name, source_name = FIELDS_BY_FLAG[target], FIELDS_BY_FLAG[source]

    def derive_default(ctx: RuleContext) -> None:
        value = ctx.values[source_name]
        if ctx.values[target_name] is None and not (only_if_set and value is None):
            ctx.derive(target_name, value)

    return rule(code, target, source, summary=f"--{target} defaults to --{source} (derived).")(derive_default)
