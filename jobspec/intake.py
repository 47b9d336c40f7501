"""Turn a raw spec object into field values, and pydantic validation errors into `SpecIssue`s."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from pydantic import ValidationError
from pydantic_core import SchemaValidator

from jobspec.argv import parse_passthrough_scalar, passthrough_prefix, unknown_flag_issue
from jobspec.bounds import (
    INT_MAX,
    INT_MIN,
    MAX_DEMAND_GPUS,
    MAX_JSON_DEPTH,
    MAX_SPEC_KEYS,
    MAX_SUGGESTIONS,
    MAX_WORD_LENGTH,
    shown,
    untyped_problem,
)
from jobspec.issues import SpecIssue
from jobspec.spec import FIELDS, FIELDS_BY_FLAG, PASSTHROUGH, SGLANG_PREFIX, FieldSpec, JobSpec

__all__ = [
    "values_from_obj",
    "normalize_passthrough",
    "promote_typed_sglang",
    "validate_spec",
    "validate_values",
    "check_representable",
    "check_untyped",
    "issues_from_validation",
]

PASSTHROUGH_FIELDS = frozenset(PASSTHROUGH.values())
_PASSTHROUGH_KEY = re.compile(r"^[A-Za-z0-9_]+$")
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# Values whose invalid-choice hint says more than "did you mean".
_CHOICE_HINTS = {
    ("advantage_estimator", "on_policy_distillation"): (
        "on-policy distillation is no longer an advantage estimator: keep an estimator such as grpo and "
        "add --use-opd --opd-type sglang|megatron"
    ),
}


def _key_to_name(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def values_from_obj(obj: Any) -> tuple[dict[str, Any], list[SpecIssue]]:
    """Map a JSON/YAML object (keys with '-' or '_') onto field names; unknown keys become issues."""
    issues: list[SpecIssue] = []
    values: dict[str, Any] = {}
    origin_key: dict[str, str] = {}
    passthrough: dict[str, dict[str, Any]] = {}
    if not isinstance(obj, Mapping):
        issues.append(
            SpecIssue(
                "spec.invalid_type",
                None,
                f"a job spec must be an object (mapping of parameter to value), got {type(obj).__name__}",
                "write the spec as a YAML/JSON object, e.g. {rollout_batch_size: 8}",
            )
        )
        return values, issues
    if len(obj) > MAX_SPEC_KEYS:
        issues.append(_too_many_keys(None, len(obj)))
        return values, issues
    unknown = 0
    for raw_key, value in obj.items():
        if not isinstance(raw_key, str):
            issues.append(
                SpecIssue(
                    "spec.invalid_type",
                    None,
                    f"parameter names must be strings, got {raw_key!r}",
                    "quote the key",
                )
            )
            continue
        name = _key_to_name(raw_key)
        flag = name.replace("_", "-")
        if name in PASSTHROUGH_FIELDS:
            if not isinstance(value, Mapping):
                issues.append(
                    SpecIssue(
                        "spec.invalid_type",
                        FIELDS[name].flag,
                        f"'{name}' must map SGLang argument names to values, got {value!r}",
                        f"write {name}: {{mem_fraction_static: 0.7}}",
                    )
                )
                continue
            if len(value) > MAX_SPEC_KEYS:
                issues.append(_too_many_keys(FIELDS[name].flag, len(value)))
                continue
            target_map = passthrough.setdefault(name, {})
            prefix = next(p for p, n in PASSTHROUGH.items() if n == name).replace("-", "_")
            for k, v in value.items():
                key = _key_to_name(str(k))
                if key.startswith(prefix):
                    key = key[len(prefix) :]
                if key in target_map:
                    issues.append(_duplicate(f"{prefix.replace('_', '-')}{key.replace('_', '-')}"))
                target_map[key] = v
            continue
        target = name if name in FIELDS and FIELDS[name].kind != "passthrough" else FIELDS_BY_FLAG.get(flag)
        if target is not None and target != name and flag in FIELDS[target].switches:
            # A value-less flag used as a key (`no-rope-fusion: true`): true gives what the flag
            # stores, false its opposite.
            stored = FIELDS[target].switches[flag]
            if not isinstance(value, bool):
                issues.append(
                    SpecIssue(
                        "spec.invalid_type",
                        FIELDS[target].flag,
                        f"'{raw_key}' is a flag and takes true or false, got {value!r}",
                        f"write {raw_key}: true, or {target}: {str(stored).lower()}",
                    )
                )
                continue
            value = stored if value else not stored
        prefix = passthrough_prefix(flag) if target is None else None
        if prefix is not None:
            target_map = passthrough.setdefault(PASSTHROUGH[prefix], {})
            key = flag[len(prefix) :].replace("-", "_")
            if key in target_map:
                issues.append(_duplicate(flag))
            target_map[key] = value
            continue
        if target is None:
            unknown += 1
            issue = unknown_flag_issue(flag, suggest=unknown <= MAX_SUGGESTIONS)
            if "_" in raw_key and issue.hint.startswith("did you mean --"):
                suggestion = issue.hint[len("did you mean --") : -1].replace("-", "_")
                issue = SpecIssue(
                    issue.code, issue.field, f"unknown parameter '{raw_key}'", f"did you mean '{suggestion}'?"
                )
            else:
                issue = SpecIssue(issue.code, issue.field, f"unknown parameter '{raw_key}'", issue.hint)
            issues.append(issue)
            continue
        if target in values:
            issues.append(_duplicate(FIELDS[target].flag, (origin_key[target], raw_key)))
        values[target] = _lift(FIELDS[target], value)
        origin_key[target] = raw_key
    values.update(passthrough)
    return values, issues


def _lift(spec: FieldSpec, value: Any) -> Any:
    """Object-only conveniences: a float accepts its decimal text (YAML 1.1 reads `1e-6` as text), a list
    parameter accepts a single item (as its command line does), and --eval-prompt-data accepts a
    {name: path} mapping."""
    if spec.kind == "float" and isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
        # PyYAML (YAML 1.1) reads exponent floats without a dot, such as `lr: 1e-6`, as strings.
        return float(value)
    if spec.kind != "list" or value is None:
        return value
    if spec.path_layout == "name_path_pairs" and isinstance(value, Mapping):
        return [item for pair in value.items() for item in pair]
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    return value


def _too_many_keys(flag: str | None, count: int) -> SpecIssue:
    where = f"--{flag}" if flag else "the spec"
    return SpecIssue(
        "spec.too_many_keys",
        flag,
        f"{where} has {count} keys; at most {MAX_SPEC_KEYS} are read",
        "give each parameter once (the reference has about 1,100)",
    )


def _duplicate(flag: str, keys: tuple[str, str] | None = None) -> SpecIssue:
    detail = f" (as '{keys[0]}' and '{keys[1]}')" if keys else ""
    return SpecIssue(
        "spec.duplicate_key",
        flag,
        f"--{flag} is given more than once{detail}",
        "keep a single spelling of each parameter",
    )


def promote_typed_sglang(values: dict[str, Any]) -> list[SpecIssue]:
    """Move passthrough keys that name a typed ``--sglang-*`` field (e.g. profile) to that field."""
    issues: list[SpecIssue] = []
    passthrough = values.get("sglang")
    if not isinstance(passthrough, dict):
        return issues
    for key in list(passthrough):
        name = FIELDS_BY_FLAG.get(f"{SGLANG_PREFIX}{str(key).replace('_', '-')}")
        if name is None:
            continue
        value = passthrough.pop(key)
        if name in values:
            issues.append(_duplicate(FIELDS[name].flag))
        else:
            values[name] = value
    return issues


def normalize_passthrough(raw: Any, prefix: str = SGLANG_PREFIX) -> tuple[dict[str, Any], list[SpecIssue]]:
    """Canonical form of the SGLang passthrough, so that `to_argv()` round-trips it exactly.

    On the command line these values are untyped words, so the canonical form is what a word
    reads back as: numeric strings become numbers, a one-item list becomes its item, mappings
    become their JSON text. False/None cannot be written as a bare SGLang flag and are dropped
    with a warning.
    """
    issues: list[SpecIssue] = []
    out: dict[str, Any] = {}
    for key, value in raw.items():
        flag = f"{prefix}{str(key).replace('_', '-')}"
        if not _PASSTHROUGH_KEY.match(str(key)):
            issues.append(
                SpecIssue(
                    "spec.invalid_type",
                    flag,
                    f"invalid SGLang argument name {key!r}",
                    "use letters, digits, '-' or '_'",
                )
            )
            continue
        if value is False or value is None:
            issues.append(
                SpecIssue(
                    "spec.sglang_value_dropped",
                    flag,
                    f"--{flag} is {value!r}; an SGLang flag can only be switched on, so it is left out",
                    f"remove --{flag} (SGLang's default applies)",
                    severity="warning",
                )
            )
            continue
        if isinstance(value, Mapping):
            value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            issues.append(
                SpecIssue(
                    "spec.invalid_value",
                    flag,
                    f"--{flag} is an empty list",
                    f"give --{flag} at least one value or remove it",
                )
            )
            continue
        typed: list[Any] = []
        bad = False
        for item in items:
            if isinstance(item, bool) and (isinstance(value, list) or item is not True):
                bad = True
            elif isinstance(item, str):
                item = parse_passthrough_scalar(item)
                if isinstance(item, str) and item.startswith("-") and not item == "-":
                    issues.append(_unrepresentable(flag, item))
                    bad = True
            elif isinstance(item, float) and not math.isfinite(item):
                bad = True
            elif not isinstance(item, (int, float, bool)):
                bad = True
            typed.append(item)
        if bad:
            if not any(i.field == flag for i in issues):
                issues.append(
                    SpecIssue(
                        "spec.invalid_type",
                        flag,
                        f"--{flag} must be true, a number, a string or a list of numbers/strings, got {value!r}",
                        "SGLang passthrough values are command-line words",
                    )
                )
            continue
        out[str(key)] = typed if isinstance(value, list) and len(typed) > 1 else typed[0]
    return out, issues


def _unrepresentable(flag: str, item: str) -> SpecIssue:
    return SpecIssue(
        "spec.argv_unrepresentable",
        flag,
        f"--{flag}: list item {item!r} starts with '-', which Relax's command line reads as a flag",
        "remove the leading '-' or move the value into a file the job reads",
    )


def check_untyped(values: dict[str, Any]) -> list[SpecIssue]:
    """The values the model does not type (JSON parameters other than --resource, each SGLang passthrough
    value) within the bounds of any value (`jobspec.bounds.untyped_problem`): depth, numbers, strings.
    A value out of bounds is removed from `values` (the parameter stays at its default), so that nothing
    after this step walks it (a JSON dump of 1,000 levels fails with RecursionError)."""
    issues: list[SpecIssue] = []

    def judge(flag: str, value: Any) -> bool:
        problem = untyped_problem(value)
        if problem is not None:
            issues.append(
                SpecIssue(
                    "spec.out_of_range",
                    flag,
                    f"--{flag} {problem}",
                    f"nest at most {MAX_JSON_DEPTH} levels; integers from {INT_MIN} to {INT_MAX}, finite "
                    f"numbers, strings of at most {MAX_WORD_LENGTH} characters",
                )
            )
        return problem is None

    for name, value in list(values.items()):
        spec = FIELDS.get(name)
        if spec is None or name == "resource":
            continue
        if spec.kind == "json" and not judge(spec.flag, value):
            del values[name]
        elif spec.kind == "passthrough" and isinstance(value, dict):
            prefix = next(p for p, n in PASSTHROUGH.items() if n == name)
            for key in [k for k, v in value.items() if not judge(f"{prefix}{str(k).replace('_', '-')}", v)]:
                del value[key]
    return issues


def check_representable(values: dict[str, Any]) -> list[SpecIssue]:
    """List items that cannot be written on a Relax command line (they would parse as flags)."""
    issues = []
    for name, value in values.items():
        spec = FIELDS.get(name)
        if spec is None or spec.kind != "list" or not isinstance(value, list):
            continue
        for item in value:
            if isinstance(item, str) and item.startswith("-") and not re.match(r"^-\d", item):
                issues.append(_unrepresentable(spec.flag, item))
                break
    return issues


def validate_values(values: dict[str, Any]) -> tuple[dict[str, Any], list[SpecIssue], set[str]]:
    """Type-check `values` strictly. Returns (all field values with defaults, issues, bad field names)."""
    spec, issues, bad = validate_spec(values)
    return spec.model_dump(), issues, bad


def validate_spec(values: dict[str, Any]) -> tuple[JobSpec, list[SpecIssue], set[str]]:
    """`validate_values`, with the spec itself: every field, the bad ones at their defaults.

    A spec whose values all pass is the defaults' spec with the given values validated by `validate_given`
    (the same field validators, ~1/7 of the instructions of validating all ~1,060 fields); one that fails
    any is validated whole, as before, for its errors."""
    try:
        given = validate_given(values)
    except (ValidationError, KeyError):
        pass
    else:
        return _defaults_with(given), [], set()
    try:
        return JobSpec.model_validate(values, strict=True), [], set()
    except ValidationError as exc:
        issues, bad = issues_from_validation(exc, values)
        clean = {k: v for k, v in values.items() if k not in bad}
        return JobSpec.model_validate(clean, strict=True), issues, bad


@cache
def default_spec() -> JobSpec:
    """`JobSpec.model_validate({}, strict=True)`: every field at its default (shared: a spec is frozen; its
    lists and dicts are made anew for each spec by `_defaults_with`)."""
    return JobSpec.model_validate({}, strict=True)


def _defaults_with(given: dict[str, Any]) -> JobSpec:
    """What `JobSpec.model_validate(values, strict=True)` gives for values that `validate_given` made `given`:
    the defaults' spec with `given`, a new list or dict from its factory for each field that has one and is
    not given (as the model makes them for each spec), and `given`'s names as the fields set."""
    update = {name: make() for name, make in _factories() if name not in given}
    update.update(given)
    spec = default_spec().model_copy(update=update)
    object.__setattr__(spec, "__pydantic_fields_set__", set(given))
    return spec


def validate_given(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (field names to values), each validated strictly by its field's own validator, as
    `JobSpec.model_validate(values, strict=True)` validates it, and nothing else: no default is filled in.
    Raises `ValidationError` when one fails, or `KeyError` for a name that is no field (callers report
    either by validating through the model instead). One validator a field, not one of the whole model or a
    typed dict of its fields: those look each of the ~1,060 names up in `values` (~0.25M instructions)."""
    validators = _FIELD_VALIDATORS
    out = {}
    for name, value in values.items():
        validate = validators.get(name)
        if validate is None:
            validate = _field_validator(name)
        out[name] = validate(value, strict=True)
    return out


_FIELD_VALIDATORS: dict[str, Callable[..., Any]] = {}  # field name -> its validator's validate_python


def _field_validator(name: str) -> Callable[..., Any]:
    """The `validate_python` of a validator of field `name` alone: the schema the model validates it with (the
    model's own core schema, its `default` wrapper removed), with the model's config (no inf/nan)."""
    model = JobSpec.__pydantic_core_schema__
    field = model["schema"]["fields"][name]  # KeyError: no such field
    validate = SchemaValidator(field["schema"]["schema"], model.get("config")).validate_python
    _FIELD_VALIDATORS[name] = validate
    return validate


@cache
def _factories() -> tuple[tuple[str, Callable[[], Any]], ...]:
    """The default factories of `JobSpec`'s fields that have one (lists and dicts, made anew for each spec),
    after checking that every other default is a plain value that the model fills in as it is (not a copy),
    as `_defaults_with` takes it from `default_spec()`."""
    model = JobSpec.__pydantic_core_schema__
    if model["type"] != "model" or model["schema"]["type"] != "model-fields":  # pragma: no cover
        raise RuntimeError(f"JobSpec's core schema is a {model['type']!r}: validate_given needs a model")
    factories = []
    for name, f in model["schema"]["fields"].items():
        wrapped = f["schema"]
        if (
            wrapped["type"] != "default"
            or wrapped.get("copy_default")
            or wrapped.get("default_factory_takes_data")
            or f.get("validation_alias") is not None
        ):  # pragma: no cover
            raise RuntimeError(f"JobSpec.{name}: validate_given needs a plain field with a plain default")
        if "default_factory" in wrapped:
            factories.append((name, wrapped["default_factory"]))
        elif isinstance(wrapped["default"], (dict, list, set)):  # pragma: no cover  (shared by every spec)
            raise RuntimeError(f"JobSpec.{name}: a mutable default would be shared by every spec")
    return tuple(factories)


def issues_from_validation(exc: ValidationError, values: dict[str, Any]) -> tuple[list[SpecIssue], set[str]]:
    """One issue per field `exc` refuses, and those fields' names."""
    issues: list[SpecIssue] = []
    bad: set[str] = set()
    for err in exc.errors(include_url=False):
        name = str(err["loc"][0]) if err["loc"] else ""
        if name in bad or name not in FIELDS:
            continue
        bad.add(name)
        issues.append(_issue_from_error(FIELDS[name], err, values.get(name)))
    return issues, bad


def _issue_from_error(spec: FieldSpec, err: Any, value: Any) -> SpecIssue:
    etype = err["type"]
    where = f"--{spec.flag}" + "".join(f"[{shown(p)}]" for p in err["loc"][1:])
    bad = err.get("input", value)
    if spec.name == "resource":
        ranged = etype in ("greater_than_equal", "less_than_equal")
        return SpecIssue(
            "spec.out_of_range" if ranged else "spec.invalid_type",
            spec.flag,
            f"{where} must map each role to [replicas, gpus] (two integers from 0 to {MAX_DEMAND_GPUS}), "
            f"got {shown(bad)}",
            'e.g. --resource \'{"actor": [1, 8], "rollout": [1, 8]}\'',
        )
    if etype == "literal_error":
        allowed = spec.choices or ()
        hint = _CHOICE_HINTS.get((spec.name, str(bad)))
        if hint is None:
            close = difflib.get_close_matches(str(bad), allowed, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(allowed)}"
        return SpecIssue(
            "spec.invalid_choice",
            spec.flag,
            f"{where} got {shown(bad)}; allowed values: {', '.join(allowed)}",
            hint,
        )
    if etype in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return SpecIssue(
            "spec.out_of_range",
            spec.flag,
            f"{where} is {shown(bad)} but must be {spec.expected()}",
            f"give --{spec.flag} {spec.expected()}",
        )
    if etype == "string_too_long":
        return SpecIssue(
            "spec.bad_path" if spec.path_kind else "spec.too_long",  # the path resolver's code for it too
            spec.flag,
            f"{where} is {len(bad)} characters long; at most {spec.max_length} are allowed",
            f"give --{spec.flag} {spec.expected()}",
        )
    if etype in ("too_short", "finite_number"):
        what = "at least one item" if etype == "too_short" else "a finite number"
        return SpecIssue(
            "spec.invalid_value",
            spec.flag,
            f"{where} is {shown(bad)} but must be {what}",
            f"give --{spec.flag} {spec.expected()}",
        )
    return SpecIssue(
        "spec.invalid_type",
        spec.flag,
        f"{where} expects {spec.expected()}, got {shown(bad)} ({type(bad).__name__})",
        f"give --{spec.flag} {spec.expected()}",
    )
