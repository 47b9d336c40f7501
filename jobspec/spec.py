"""`JobSpec`, the flat Relax configuration, and the field registry the codec, rules and docs read."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict
from pydantic.fields import FieldInfo

from jobspec.fields import ParamGroup, PathKind
from jobspec.groups import GROUP_MODELS

__all__ = [
    "JobSpec",
    "FieldSpec",
    "FIELDS",
    "FIELDS_BY_FLAG",
    "GROUPS",
    "path_fields",
    "function_path_fields",
    "megatron_fields",
    "field_for_flag",
]

# Codec kinds. Every field has exactly one; `to_argv()` and the argv parser dispatch on it.
Kind = Literal[
    "flag",  # store_true: bare --x means true; false is the absence of the flag
    "negatable",  # --x / --no-x (argparse.BooleanOptionalAction)
    "bool_value",  # argparse type=bool: takes one value, any non-empty string is true
    "int",
    "float",
    "str",
    "flag_off",  # store_false: a bare --no-x / --disable-x means false; true is the absence of the flag
    "list",  # nargs='+' ('*' and a fixed count too: see FieldSpec.nargs)
    "append",  # action='append': each occurrence adds one list of values
    "json",  # type=json.loads
    "passthrough",  # the --sglang-* mapping
]


@dataclass(frozen=True)
class FieldSpec:
    """Everything the codec, the rules and the docs need to know about one parameter."""

    name: str
    flag: str
    group: str
    kind: Kind
    default: Any
    help: str
    origin: str
    optional: bool
    item_type: str | None  # for lists: "int" | "str"
    choices: tuple[str, ...] | None  # allowed values (for lists: of each item)
    path_kind: PathKind | None
    path_layout: str | None
    function_path: bool
    aliases: tuple[str, ...]
    value_aliases: dict[str, str]
    unset: str | None
    size: bool
    # The range of a number (for a list of numbers: of each item), as declared or derived (jobspec/bounds.py).
    ge: float | None
    gt: float | None
    le: float | None
    # The longest a string (for a list of strings: each item) may be.
    max_length: int | None
    # Flags that take no value and the value each stores (store_true/store_false/--x/--no-x).
    switches: dict[str, Any]
    # Arity of list and append flags: "+", "*" or an exact count (argparse nargs).
    nargs: str | int | None
    # Values Megatron reads with a custom type: "layers" (an int or a list expression such as
    # "([0]*3+[1]*58)"), "int_tuple" ("128,0").
    pattern: str | None
    # Where the parameter is defined: "reference" (the Relax configuration document, typed here by hand
    # from it), "megatron" or "relax" (generated from that project's own argument parser).
    source: str
    # Relax code flags: the Relax versions that define it; what changed between them; gone in main.
    versions: tuple[str, ...]
    changed: dict[str, Any]
    removed_in_main: bool
    # Megatron's own default where Relax's parser resets it (the field's default is Relax's).
    megatron_default: Any
    # A flag of the later Megatron-LM lineage Relax main uses, not of the pinned commit (its parser
    # would ignore it there).
    later: bool

    @property
    def type_label(self) -> str:
        """The type as the reference writes it (int, float, str, flag, bool, json, list of ...)."""
        if self.kind in ("flag", "negatable", "flag_off"):
            return "flag"
        if self.kind == "bool_value":
            return "bool"
        if self.kind == "list":
            arity = "" if self.nargs in (None, "+") else f", {self.nargs}"
            return f"list[{self.item_type}{arity}]"
        if self.kind == "append":
            return "repeatable list"
        if self.pattern == "layers":
            return "int or layer pattern"
        if self.kind == "passthrough":
            return "mapping"
        return self.kind

    def expected(self) -> str:
        """Human wording of the accepted values, used in type-error messages."""
        base = {
            "flag": "a boolean (true/false)",
            "negatable": "a boolean (true/false)",
            "bool_value": "a boolean (true/false)",
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "flag_off": "a boolean (true/false)",
            "append": "a list of value lists",
            "json": "a JSON value",
            "passthrough": "a mapping of SGLang argument names to values",
        }.get(self.kind)
        if self.kind == "list":
            items = {"int": "integers", "float": "numbers"}.get(self.item_type or "", "strings")
            count = (
                f"a list of exactly {self.nargs}"
                if isinstance(self.nargs, int)
                else "a list of"
                if self.nargs == "*"
                else "a non-empty list of"
            )
            base = f"{count} {items}"
        if self.pattern == "layers":
            base = "an integer or a layer pattern such as ([0]*3+[1]*58)"
        elif self.pattern == "int_tuple":
            base = "integers separated by commas, e.g. 128,0"
        if self.choices:
            base = (
                f"one of {', '.join(self.choices)}"
                if self.kind != "list"
                else (f"a non-empty list of values from {', '.join(self.choices)}")
            )
        if self.optional and self.kind not in ("negatable", "flag", "flag_off"):
            base = f"{base} (or null)"
        bounds = []
        if self.ge is not None:
            bounds.append(f">= {_num(self.ge)}")
        if self.gt is not None:
            bounds.append(f"> {_num(self.gt)}")
        if self.le is not None:
            bounds.append(f"<= {_num(self.le)}")
        if bounds and (self.kind in ("int", "float") or self.item_type in ("int", "float")):
            base = f"{base}, {'each ' if self.kind == 'list' else ''}{' and '.join(bounds)}"
        if (
            self.max_length is not None
            and (self.kind == "str" or self.item_type == "str")
            and not self.choices
        ):
            base = f"{base}, {'each ' if self.kind == 'list' else ''}at most {self.max_length} characters"
        return base or "a value"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class JobSpec(*reversed(GROUP_MODELS)):  # type: ignore[misc]
    """The complete Relax configuration of one job: one flat attribute per parameter.

    Build it with `jobspec.normalize()`, which fills defaults, applies derived defaults and checks
    every cross-field rule; constructing it directly only checks types. It is frozen.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        title="RelaxJobSpec",
        json_schema_extra={"x-groups": [{"group": g.group, "title": g.title} for g in GROUP_MODELS]},
    )

    def to_argv(self) -> list[str]:
        """Relax launcher flags for every non-default value; `normalize(argv=...)` gives this spec back."""
        return encode_argv(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able flat dict with underscore keys and every field."""
        return self.model_dump(mode="json")


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """Strip `| None`; return (inner type, optional)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        inner = args[0] if len(args) == 1 else annotation
        return inner, optional
    return annotation, False


def _literal_choices(tp: Any) -> tuple[str, ...] | None:
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is Literal:
        return tuple(str(a) for a in typing.get_args(tp))
    return None


def _item_type(item: Any) -> str:
    """The item type ("int" or "str") of a list's item annotation (bounds may wrap it in Annotated)."""
    if typing.get_origin(item) is typing.Annotated:
        item = typing.get_args(item)[0]
    return "int" if item is int else "str"


def _bound(info: FieldInfo, name: str) -> float | None:
    """A constraint (ge, gt, le, max_length) of the field; for a list, of its items."""
    metadata = list(info.metadata)
    inner, _ = _unwrap(info.annotation)
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        metadata = []
        if typing.get_origin(item) is typing.Annotated:
            for extra in typing.get_args(item)[1:]:
                metadata += extra.metadata if isinstance(extra, FieldInfo) else [extra]
    for meta in metadata:
        value = getattr(meta, name, None)
        if value is not None:
            return value
    return None


def _field_spec(name: str, info: FieldInfo) -> FieldSpec:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    inner, optional = _unwrap(info.annotation)
    choices = _literal_choices(inner)
    item_type: str | None = None
    kind: str
    if extra.get("kind"):
        kind = str(extra["kind"])
        if kind == "list":
            (item,) = typing.get_args(inner)
            choices = _literal_choices(item)
            item_type = str(extra.get("item_type") or _item_type(item))
    elif inner is bool:
        kind = "flag"
    elif inner is int:
        kind = "int"
    elif inner is float:
        kind = "float"
    elif inner is str or choices is not None:
        kind = "str"
    elif typing.get_origin(inner) is list:
        kind = "list"
        (item,) = typing.get_args(inner)
        choices = _literal_choices(item)
        item_type = _item_type(item)
    elif typing.get_origin(inner) is dict:
        kind = "json"
    else:  # pragma: no cover - a new annotation shape must be taught to the codec
        raise TypeError(f"jobspec: no codec kind for field {name!r} of type {info.annotation!r}")
    default = info.get_default(call_default_factory=True)
    if extra.get("choices") is not None:
        choices = tuple(str(c) for c in extra["choices"])  # type: ignore[union-attr]
    switches = dict(extra.get("switches") or {})  # type: ignore[arg-type]
    if not switches and kind == "flag":
        switches = {str(extra["flag"]): True}
    elif not switches and kind == "negatable":
        switches = {str(extra["flag"]): True, f"no-{extra['flag']}": False}
    nargs = extra.get("nargs", "+" if kind == "list" else None)
    return FieldSpec(
        name=name,
        flag=str(extra["flag"]),
        group=str(extra["group"]),
        kind=kind,  # type: ignore[arg-type]
        default=default,
        help=info.description or "",
        origin=str(extra.get("origin", "relax")),
        optional=optional,
        item_type=item_type,
        choices=choices,
        path_kind=extra.get("path_kind"),  # type: ignore[arg-type]
        path_layout=extra.get("path_layout"),  # type: ignore[arg-type]
        function_path=bool(extra.get("function_path", False)),
        aliases=tuple(extra.get("aliases", ())),  # type: ignore[arg-type]
        value_aliases=dict(extra.get("value_aliases", {})),  # type: ignore[arg-type]
        unset=extra.get("unset"),  # type: ignore[arg-type]
        size=bool(extra.get("size", False)),
        ge=_bound(info, "ge"),
        gt=_bound(info, "gt"),
        le=_bound(info, "le"),
        max_length=_bound(info, "max_length"),
        switches=switches,
        nargs=nargs,  # type: ignore[arg-type]
        pattern=extra.get("pattern"),  # type: ignore[arg-type]
        source=str(extra.get("source", "reference")),
        versions=tuple(extra.get("versions", ())),  # type: ignore[arg-type]
        changed=dict(extra.get("changed") or {}),  # type: ignore[arg-type]
        removed_in_main=bool(extra.get("removed_in_main", False)),
        megatron_default=extra.get("megatron_default"),
        later=bool(extra.get("later", False)),
    )


def _build_registry() -> dict[str, FieldSpec]:
    registry: dict[str, FieldSpec] = {}
    for model in GROUP_MODELS:
        for name in model.__annotations__:
            if name in model.model_fields:
                registry[name] = _field_spec(name, JobSpec.model_fields[name])
    missing = set(JobSpec.model_fields) - set(registry)
    if missing:  # pragma: no cover - guards against a field declared outside a group
        raise RuntimeError(f"jobspec: fields without a group: {sorted(missing)}")
    return registry


#: name -> FieldSpec, in reference order.
FIELDS: dict[str, FieldSpec] = _build_registry()

#: group id -> (title, field names), in reference order.
GROUPS: dict[str, tuple[ParamGroup, list[str]]] = {
    model.group: (model, [n for n, f in FIELDS.items() if f.group == model.group]) for model in GROUP_MODELS
}

#: every flag Relax accepts for a field (aliases and value-less switches such as --no-x included) -> field.
FIELDS_BY_FLAG: dict[str, str] = {}
for _spec in FIELDS.values():
    if _spec.kind == "passthrough":
        continue
    for _flag in (_spec.flag, *_spec.aliases, *_spec.switches):
        if FIELDS_BY_FLAG.setdefault(_flag, _spec.name) != _spec.name:  # pragma: no cover
            raise RuntimeError(f"jobspec: --{_flag} is claimed by {FIELDS_BY_FLAG[_flag]} and {_spec.name}")


def field_for_flag(flag: str) -> FieldSpec | None:
    name = FIELDS_BY_FLAG.get(flag)
    return FIELDS[name] if name else None


def path_fields() -> dict[str, PathKind]:
    """Field name -> "input" (read by the job) or "output" (written by the job), for path-valued fields.

    `eval_prompt_data` holds name/path pairs: only its odd items (1, 3, ...) are paths.
    """
    return dict(_PATH_FIELDS)


_PATH_FIELDS: dict[str, PathKind] = {n: f.path_kind for n, f in FIELDS.items() if f.path_kind is not None}


def function_path_fields() -> list[str]:
    """Fields that hold dotted Python paths to (user or Relax) code."""
    return [n for n, f in FIELDS.items() if f.function_path]


def megatron_fields() -> list[str]:
    """The explicit list of Megatron-LM flags Relax Platform accepts (field names)."""
    return [n for n, f in FIELDS.items() if f.origin == "megatron"]


SGLANG_PREFIX = "sglang-"
#: flag prefix -> the passthrough field that collects those flags (untyped, without the prefix).
PASSTHROUGH = {"teacher-sglang-": "teacher_sglang", SGLANG_PREFIX: "sglang"}


# ---------------------------------------------------------------------------------------------
# Encoding (jobspec/argv.py decodes): here, beside the fields, so that the spec writes its own flags


def _scalar_token(value: Any) -> str:
    if isinstance(value, bool):  # pragma: no cover - booleans are flags, never tokens
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _emit_scalar(flag: str, token: str) -> list[str]:
    # `--flag=value` keeps values that start with '-' (or are empty) from being read as flags.
    if token == "" or token.startswith("-"):
        return [f"--{flag}={token}"]
    return [f"--{flag}", token]


def encode_argv(spec: Any) -> list[str]:
    """Flags for every non-default field of `spec`, in reference order."""
    out: list[str] = []
    # A JobSpec's values from its __dict__: an attribute lookup searches its ~120 base classes first (3.5 ms for
    # every field, against 0.1 ms)
    values = spec.__dict__ if isinstance(getattr(spec, "__dict__", None), dict) else None
    for f in FIELDS.values():
        value = values[f.name] if values is not None and f.name in values else getattr(spec, f.name)
        if f.kind == "passthrough":
            prefix = next(p for p, name in PASSTHROUGH.items() if name == f.name)
            for key, item in value.items():
                flag = prefix + key.replace("_", "-")
                if item is True:
                    out.append(f"--{flag}")
                elif isinstance(item, list):
                    out += [f"--{flag}", *(_scalar_token(x) for x in item)]
                else:
                    out += _emit_scalar(flag, _scalar_token(item))
            continue
        if value == f.default and type(value) is type(f.default):
            continue
        if f.kind in ("flag", "flag_off", "negatable"):
            if value is not None:
                out += [f"--{flag}" for flag, stored in f.switches.items() if stored == value][:1]
        elif f.kind == "bool_value":
            out.append(f"--{f.flag}=true" if value else f"--{f.flag}=")
        elif f.kind == "list":
            if value is not None:
                out += [f"--{f.flag}", *(_scalar_token(x) for x in value)]
        elif f.kind == "append":
            for group in value or ():
                out += [f"--{f.flag}", *(_scalar_token(x) for x in group)]
        elif f.kind == "json":
            if value is not None:
                out += [f"--{f.flag}", json.dumps(value, separators=(",", ":"), ensure_ascii=False)]
        elif value is not None:
            out += _emit_scalar(f.flag, _scalar_token(value))
    return out
