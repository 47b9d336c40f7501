"""The argv codec: Relax command-line flags <-> field values.

Decoding follows the argparse conventions of Relax's and Megatron-LM's parsers: ``--key value`` and
``--key=value``; value-less switches (store_true ``--x``, store_false ``--no-x`` / ``--disable-x``,
``--x``/``--no-x`` pairs) exactly where the parsers declare them; lists take every following token up
to the next ``--flag`` (``nargs`` of ``+``, ``*`` or an exact count); JSON flags take one JSON token;
``--sglang-*`` and ``--teacher-sglang-*`` pass through untyped; the last occurrence of a repeated flag
wins. Encoding (`jobspec.spec.encode_argv`, beside the fields, which `JobSpec.to_argv` calls) writes only
non-default values and is exact: decoding `encode_argv(spec)` gives the same values back.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from jobspec.arguments import NOT_AT_PINNED_MEGATRON
from jobspec.bounds import MAX_ARGV_WORDS, MAX_JSON_DEPTH, MAX_SUGGESTIONS, json_too_deep, shown
from jobspec.issues import SpecIssue
from jobspec.spec import PASSTHROUGH, FieldSpec, field_for_flag
from jobspec.suggest import suggest_flag

__all__ = [
    "DecodedArgv",
    "decode_argv",
    "parse_passthrough_scalar",
]


def passthrough_prefix(flag: str) -> str | None:
    """The passthrough prefix `flag` starts with (followed by a name), if any."""
    for prefix in PASSTHROUGH:
        if flag.startswith(prefix) and len(flag) > len(prefix):
            return prefix
    return None


_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off", ""}


@dataclass
class DecodedArgv:
    """Result of decoding a flag list: typed values by field name, plus issues."""

    values: dict[str, Any] = field(default_factory=dict)
    issues: list[SpecIssue] = field(default_factory=list)


def _is_flag_token(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def parse_passthrough_scalar(token: str) -> Any:
    """Type an untyped (SGLang passthrough) value: integers and finite decimals become numbers (an integer
    longer than Python reads, 4,300 digits, stays text)."""
    if _INT_RE.match(token) and len(token) <= 4300:
        return int(token)
    if _FLOAT_RE.match(token):
        value = float(token)
        if math.isfinite(value):
            return value
    return token


def _convert(spec: FieldSpec, token: str) -> tuple[Any, SpecIssue | None]:
    """Convert one command-line token to the field's Python type."""
    kind = spec.kind if spec.kind not in ("list", "append") else spec.item_type
    try:
        if kind == "int":
            return int(token), None
        if kind == "float":
            return float(token), None
        if kind == "json":
            if json_too_deep(token):
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            return json.loads(token), None
        if kind == "bool_value":
            return _parse_bool_value(spec, token)
        return token, None
    except (ValueError, json.JSONDecodeError) as exc:
        expected = {"int": "an integer", "float": "a number", "json": "a JSON value"}.get(
            str(kind), "a value"
        )
        code = "spec.invalid_json" if kind == "json" else "spec.invalid_type"
        detail = f" ({exc})" if kind == "json" else ""
        return None, SpecIssue(
            code=code,
            field=spec.flag,
            message=f"--{spec.flag} expects {expected}, got {shown(token)}{detail}",
            hint=_type_hint(spec),
        )


def _parse_bool_value(spec: FieldSpec, token: str) -> tuple[Any, SpecIssue | None]:
    lowered = token.strip().lower()
    if lowered in _TRUE:
        return True, None
    if lowered in _FALSE:
        issue = None
        if token != "":
            issue = SpecIssue(
                code="argv.bool_value_quirk",
                field=spec.flag,
                message=(
                    f"--{spec.flag} {token!r} is read as false here, but Relax parses this flag with "
                    f"argparse type=bool, where any non-empty value (even {token!r}) means true"
                ),
                hint=f"write --{spec.flag}= (an empty value) for false; to_argv() does so",
                severity="warning",
            )
        return False, issue
    return None, SpecIssue(
        code="spec.invalid_type",
        field=spec.flag,
        message=f"--{spec.flag} expects a boolean, got {shown(token)}",
        hint="use true or false",
    )


def _type_hint(spec: FieldSpec) -> str:
    if spec.kind in ("list", "append"):
        return f"give --{spec.flag} {spec.expected()}"
    if spec.kind == "json":
        return f"quote the JSON for the shell, e.g. --{spec.flag} '{{\"key\": 1}}'"
    return f"give --{spec.flag} {spec.expected()}"


def decode_argv(argv: list[str]) -> DecodedArgv:
    """Decode Relax flags into field values (typed, not yet validated) and issues."""
    out = DecodedArgv()
    if len(argv) > MAX_ARGV_WORDS:
        out.issues.append(
            SpecIssue(
                "argv.too_long",
                None,
                f"the command line has {len(argv)} words; at most {MAX_ARGV_WORDS} are read",
                "give each parameter once; put long lists in a file the job reads",
            )
        )
        return out
    unknown = 0
    seen: set[str] = set()
    passthrough: dict[str, dict[str, Any]] = {}
    i, n = 0, len(argv)
    while i < n:
        token = argv[i]
        if not isinstance(token, str):
            out.issues.append(
                SpecIssue(
                    "argv.unexpected_token",
                    None,
                    f"argv items must be strings, got {shown(token)}",
                    "pass the command line as a list of strings",
                )
            )
            i += 1
            continue
        if not _is_flag_token(token):
            out.issues.append(
                SpecIssue(
                    "argv.unexpected_token",
                    None,
                    f"unexpected argument {shown(token)}: it follows no flag that takes a value",
                    "every value must follow its --flag; quote values that contain spaces",
                )
            )
            i += 1
            continue
        body, inline = token[2:], None
        if "=" in body:
            body, inline = body.split("=", 1)
        j = i + 1
        values: list[str] = []
        while j < n and isinstance(argv[j], str) and not _is_flag_token(argv[j]):
            values.append(argv[j])
            j += 1
        i = j
        if inline is not None:
            if values:
                out.issues.append(_extra_values(body, values))
                values = []
            values = [inline]
            has_inline = True
        else:
            has_inline = False

        spec = field_for_flag(body)
        prefix = passthrough_prefix(body) if spec is None else None
        if prefix is not None:
            target = passthrough.setdefault(PASSTHROUGH[prefix], {})
            key = body[len(prefix) :].replace("-", "_")
            if key in target:
                out.issues.append(_repeated(body))
            target[key] = (
                True
                if not values
                else parse_passthrough_scalar(values[0])
                if len(values) == 1
                else [parse_passthrough_scalar(v) for v in values]
            )
            continue
        if spec is None:
            unknown += 1
            out.issues.append(unknown_flag_issue(body, suggest=unknown <= MAX_SUGGESTIONS))
            continue
        if spec.name in seen and spec.kind != "append":
            out.issues.append(_repeated(body))
        seen.add(spec.name)

        if body in spec.switches:
            if values:
                others = [f"--{f}" for f in spec.switches if f != body]
                out.issues.append(
                    SpecIssue(
                        "argv.unexpected_value",
                        spec.flag,
                        f"--{body} is a flag and takes no value, got {' '.join(map(repr, values))}",
                        f"write --{body} alone" + (f" (or {' / '.join(others)})" if others else ""),
                    )
                )
                continue
            out.values[spec.name] = spec.switches[body]
            continue
        if spec.kind in ("list", "append"):
            if has_inline and values == [""]:
                values = []
            count_ok = (
                len(values) == spec.nargs
                if isinstance(spec.nargs, int)
                else bool(values) or spec.nargs == "*"
            )
            if not count_ok:
                what = (
                    f"exactly {spec.nargs} value{'s' if spec.nargs != 1 else ''}"
                    if isinstance(spec.nargs, int)
                    else "one or more values"
                )
                out.issues.append(_missing_value(spec, body, what, given=values))
                continue
            converted, bad = [], False
            for tok in values:
                value, issue = _convert(spec, tok)
                if issue is not None:
                    out.issues.append(issue)
                    bad = True
                converted.append(value)
            if bad:
                continue
            if spec.kind == "append":
                out.values.setdefault(spec.name, []).append(converted)
            else:
                out.values[spec.name] = converted
            continue
        # scalar kinds: int, float, str, json, bool_value
        if not values:
            out.issues.append(_missing_value(spec, body, "a value"))
            continue
        if len(values) > 1:
            out.issues.append(_extra_values(body, values[1:]))
        value, issue = _convert(spec, values[0])
        if issue is not None:
            out.issues.append(issue)
            if issue.severity == "error":
                continue
        out.values[spec.name] = value
    out.values.update(passthrough)
    return out


def unknown_flag_issue(flag: str, *, suggest: bool = True) -> SpecIssue:
    """`spec.unknown_key` for `flag`, with a did-you-mean when `suggest` (a search over every flag: callers
    suggest for the first MAX_SUGGESTIONS unknown flags of a spec only)."""
    if flag in NOT_AT_PINNED_MEGATRON:
        return SpecIssue(
            "spec.unknown_key",
            flag,
            f"unknown parameter --{flag}: {NOT_AT_PINNED_MEGATRON[flag]}, not of Megatron-LM at 3714d81 "
            "(the commit Relax pins), whose parser Relax uses; Relax would ignore it",
            f"remove --{flag}",
        )
    suggestion = suggest_flag(flag) if suggest else None
    hint = (
        f"did you mean --{suggestion}?"
        if suggestion
        else "see docs/reference/parameters.md for every parameter"
    )
    return SpecIssue(
        "spec.unknown_key",
        flag,
        f"unknown parameter --{flag}",
        hint,
    )


def _repeated(flag: str) -> SpecIssue:
    return SpecIssue(
        "argv.repeated_flag",
        flag,
        f"--{flag} is given more than once; the last value wins (as in Relax)",
        f"remove the earlier --{flag}",
        severity="warning",
    )


def _missing_value(spec: FieldSpec, body: str, what: str, given: list[str] | None = None) -> SpecIssue:
    got = f"got {len(given)}: {' '.join(map(repr, given))}" if given else "none was given"
    return SpecIssue(
        "argv.missing_value",
        spec.flag,
        f"--{body} expects {what} but {got}",
        _type_hint(spec),
    )


def _extra_values(flag: str, extra: list[str]) -> SpecIssue:
    return SpecIssue(
        "argv.unexpected_value",
        flag,
        f"--{flag} takes one value; unexpected extra value(s) {' '.join(map(repr, extra))}",
        "quote a value that contains spaces; only list flags take several values",
    )
