"""Field helpers shared by every parameter group: `param()`, the `ParamGroup` base, size parsing."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, ClassVar, Literal

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.fields import FieldInfo

from jobspec import bounds

PathKind = Literal["input", "output"]
Origin = Literal["relax", "megatron", "platform"]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> Any:
    """Turn "512MB" / "1GiB" / "4096" into bytes (binary units, as Relax's defaults are).

    Relax itself only takes plain integers on the command line; the unit suffixes are a
    convenience for YAML/JSON specs, and `to_argv()` always writes the integer.
    """
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            number = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
            if number.is_integer():
                return int(number)
    return value


ByteSize = Annotated[int, BeforeValidator(parse_size)]


def param(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    origin: Origin = "relax",
    kind: str | None = None,
    path_kind: PathKind | None = None,
    path_layout: str | None = None,
    function_path: bool = False,
    size: bool = False,
    aliases: tuple[str, ...] = (),
    value_aliases: dict[str, str] | None = None,
    unset: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    nargs: str | None = None,
) -> Any:
    """Declare one Relax parameter.

    help: English help text (from the reference). flag: the Relax flag without ``--`` (defaults
    to the field name with hyphens). origin: who defines the flag (Relax, Megatron passthrough, or a
    platform extension). kind: codec override ("bool_value" for ``type=bool`` flags, "negatable"
    for ``--x/--no-x`` pairs). path_kind: "input"/"output" for filesystem paths the platform
    resolves. function_path: a dotted Python path to user code. size: accepts "512MB" in specs.
    aliases: other flags Relax accepts for the same parameter. value_aliases: deprecated values
    mapped to their replacement (with a warning). unset: what a None default means at run time.
    """
    extra: dict[str, Any] = {"origin": origin}
    for key, val in (
        ("flag", flag),
        ("kind", kind),
        ("path_kind", path_kind),
        ("path_layout", path_layout),
        ("unset", unset),
    ):
        if val is not None:
            extra[key] = val
    if function_path:
        extra["function_path"] = True
    if nargs is not None:
        extra["nargs"] = nargs
    if size:
        extra["size"] = True
    if aliases:
        extra["aliases"] = list(aliases)
    if value_aliases:
        extra["value_aliases"] = dict(value_aliases)
    kwargs: dict[str, Any] = {"description": help, "json_schema_extra": extra}
    for key, val in (("ge", ge), ("gt", gt), ("le", le), ("min_length", min_length)):
        if val is not None:
            kwargs[key] = val
    if isinstance(default, (dict, list)):
        snapshot = default

        def factory() -> Any:
            return type(snapshot)(snapshot)

        return Field(default_factory=factory, **kwargs)
    return Field(default=default, **kwargs)


class _GroupMeta(type(BaseModel)):  # type: ignore[misc]
    """Turns class attributes made with `jobspec.arguments.megatron()` / `relax_code()` into fields
    typed from the generated argument tables, in class-body order."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> Any:
        from jobspec.arguments import ArgumentRef

        if any(isinstance(v, ArgumentRef) for v in namespace.values()):
            written = namespace.get("__annotations__", {})
            ordered: dict[str, Any] = {}
            for key, value in list(namespace.items()):
                if isinstance(value, ArgumentRef):
                    ordered[key], namespace[key] = value.build(key)
                elif key in written:
                    ordered[key] = written[key]
            ordered.update({k: v for k, v in written.items() if k not in ordered})
            namespace["__annotations__"] = ordered
        return super().__new__(mcs, name, bases, namespace, **kwargs)


class ParamGroup(BaseModel, metaclass=_GroupMeta):
    """Base of every parameter group: one model per section of the Relax configuration reference.

    Subclasses set `group` (a stable identifier) and `title` (the reference section); each field
    they declare gets ``group`` and ``flag`` written into its metadata, so `JobSpec`, which
    inherits every group, still knows where each of its flat fields came from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=False)

    group: ClassVar[str] = ""
    title: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.__dict__.get("group"):
            return
        own = [name for name in cls.__dict__.get("__annotations__", {}) if name in cls.model_fields]
        for name in own:
            info = cls.model_fields[name]
            extra = info.json_schema_extra
            if not isinstance(extra, dict):
                extra = {}
                info.json_schema_extra = extra
            extra["group"] = cls.group
            extra.setdefault("flag", name.replace("_", "-"))
        if any([_bound_field(name, cls.model_fields[name]) for name in own]):
            cls.model_rebuild(force=True)


_BOUND_TYPES = {"ge": annotated_types.Ge, "gt": annotated_types.Gt, "le": annotated_types.Le}


def _constraint(metadata: list[Any], key: str) -> Any:
    return next((getattr(m, key) for m in metadata if getattr(m, key, None) is not None), None)


def _bound_field(name: str, info: FieldInfo) -> bool:
    """Give a field the range its declaration does not state (`jobspec.bounds`): numbers their kind's
    range, strings their length; for a list, its items. Returns whether anything was added."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    number, is_list = bounds.number_kind(info.annotation)
    if number is not None:
        if not is_list:
            missing = bounds.number_range(
                name,
                number,
                info.default,
                size=bool(extra.get("size")),
                **{k: _constraint(info.metadata, k) for k in _BOUND_TYPES},
            )
            # before any validator of the field: a constraint after one would judge nothing
            info.metadata[0:0] = [_BOUND_TYPES[k](v) for k, v in missing.items()]
            return bool(missing)
        return _bound_items(
            info,
            lambda meta: bounds.number_range(
                name, number, None, **{k: _constraint(meta, k) for k in _BOUND_TYPES}
            ),
        )
    text, is_list = bounds.string_kind(info.annotation)
    if not text:
        return False
    longest = (
        bounds.MAX_PATH_LENGTH
        if extra.get("path_kind") or extra.get("function_path")
        else bounds.MAX_WORD_LENGTH
    )
    if not is_list:
        if _constraint(info.metadata, "max_length") is not None:
            return False
        info.metadata.insert(0, annotated_types.MaxLen(longest))
        return True
    return _bound_items(info, lambda meta: {} if _constraint(meta, "max_length") else {"max_length": longest})


def _bound_items(info: FieldInfo, missing_for: Any) -> bool:
    """Rewrite `list[T] | None` as `list[Annotated[T, Field(<missing bounds>)]] | None`."""
    inner = bounds.unwrap_optional(info.annotation)
    optional = inner != info.annotation
    (item,) = typing.get_args(inner)
    meta: list[Any] = []
    if typing.get_origin(item) is Annotated:
        rest = typing.get_args(item)[1:]
        meta = [m for r in rest for m in (r.metadata if isinstance(r, FieldInfo) else [r])]
    missing = missing_for(meta)
    if not missing:
        return False
    annotation: Any = list[Annotated[item, Field(**missing)]]  # type: ignore[valid-type]
    info.annotation = annotation | None if optional else annotation
    return True
