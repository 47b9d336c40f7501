"""Fields from the generated argument tables: Megatron-LM's whole surface and Relax's code flags.

`jobspec/generated/arguments.py` (made by `python -m tools.arguments.generate` from the argparse
parsers themselves) lists every flag Megatron-LM defines at the commit Relax pins and every flag
Relax's argument code defines. This module turns one table entry into a pydantic field: its type,
arity, choices and default come from the table, never from a hand-written annotation.

- A hand-written group names a Megatron parameter it documents with `megatron(...)` instead of an
  annotated field; platform metadata (bounds, paths, what an unset value means) can be added there.
- Every Megatron parameter and every Relax code flag that no hand-written group declares is a field
  of a generated group, one per argparse group of its source (`generated_groups`).
- Defaults are the ones Relax's parser ends up with: Megatron's, except where Relax resets them
  (`RELAX_MEGATRON_DEFAULTS`, Relax main).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from jobspec.bounds import INT_MAX, INT_MIN
from jobspec.generated.arguments import (
    MEGATRON_ARGUMENTS,
    RELAX_ARGUMENTS,
    RELAX_MEGATRON_DEFAULTS,
    SOURCES,
)

__all__ = [
    "ArgumentRef",
    "megatron",
    "relax_code",
    "MEGATRON",
    "RELAX",
    "RELAX_MAIN",
    "megatron_default",
    "FIELD_DEVIATIONS",
    "NOT_AT_PINNED_MEGATRON",
    "generated_group_specs",
    "layer_pattern",
]

RELAX_MAIN: str = SOURCES["relax_main"]


def _by_dest(entries: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """dest -> entry. Two actions writing one dest (Megatron's --inference-max-requests and
    --inference-max-batch-size) become one field with both flags; argparse keeps the first default."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        first = out.get(entry["dest"])
        if first is None:
            out[entry["dest"]] = dict(entry)
        else:
            first["flags"] = [*first["flags"], *(f for f in entry["flags"] if f not in first["flags"])]
    return out


#: dest -> table entry
MEGATRON: dict[str, dict[str, Any]] = _by_dest(MEGATRON_ARGUMENTS)
RELAX: dict[str, dict[str, Any]] = _by_dest(RELAX_ARGUMENTS)
_RESETS: dict[str, Any] = RELAX_MEGATRON_DEFAULTS[RELAX_MAIN]

# Custom argparse types of Megatron whose values are an integer or a Python list expression of 0/1
# (moe_freq_type, la_freq_type, no_rope_freq_type), a tuple of integers (tuple_type), or names.
_PATTERN_TYPES = {"moe_freq_type", "la_freq_type", "no_rope_freq_type"}
_LAYER_PATTERN = re.compile(r"^[\d\s\[\]\(\)\+\*,]+$")


#: Flags that Relax's configuration reference mentions but Megatron-LM at the commit Relax pins does not
#: define (they come from later Megatron-LM versions). Relax's parser ignores unknown flags, so they
#: would do nothing there; here they are refused with this explanation.
NOT_AT_PINNED_MEGATRON: dict[str, str] = {
    "no-use-precision-aware-optimizer": "later Megatron-LM versions make --use-precision-aware-optimizer "
    "negatable; at 3714d81 it is off unless given",
}


#: Parameters of the configuration reference (typed by hand from it) that deliberately differ from the
#: definition in Relax's argument code at main, and why. Every other reference parameter that Relax's
#: code defines agrees with it in kind, flags, default, choices and arity (tests/unit/jobspec/test_arguments.py).
FIELD_DEVIATIONS: dict[str, str] = {
    "train_backend": "adds the platform's `torch` backend to Relax's only choice, `megatron`",
    "advantage_estimator": "adds `rloo`, which the configuration reference (zh) documents and public Relax "
    "scripts use, beyond main 039ce87's choices",
    "loss_type": "`sft_loss` / `sft-loss` are accepted as deprecated spellings and normalized to `sft` "
    "with a warning instead of being separate choices",
    "disable_grpo_std_normalization": "named after its flag, true when given; Relax's dest is "
    "grpo_std_normalization, false when given",
    "disable_rewards_normalization": "named after its flag, true when given; Relax's dest is "
    "rewards_normalization, false when given",
    "disable_compute_advantages_and_returns": "named after its flag, true when given; Relax's dest is "
    "compute_advantages_and_returns, false when given",
    "disable_weights_backuper": "named after its flag, true when given; Relax's dest is "
    "enable_weights_backuper, false when given",
    "slime_router_middleware_paths": "unset means none; Relax's code gives this list flag the string '' "
    "as its default, which means the same",
}


def megatron_default(dest: str) -> Any:
    """Megatron-LM's own default for `dest`, before Relax's reset."""
    return MEGATRON[dest]["default"]


def layer_pattern(value: Any) -> list[int] | int:
    """Evaluate a Megatron layer pattern ("([0]*3+[1]*58)", "[1]*48" or "4") without `eval`.

    Megatron evaluates these with `eval` after checking the characters; here only list literals,
    integers, `+` and `*` are folded.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if "[" not in text:
        return int(text)
    if not _LAYER_PATTERN.match(text):
        raise ValueError("only digits, [, ], (, ), +, * and commas are allowed")

    def fold(node: ast.AST) -> Any:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.List):
            return [fold(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(fold(e) for e in node.elts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = fold(node.left), fold(node.right)
            if isinstance(node.op, ast.Mult):
                count = right if isinstance(right, int) else left
                if not isinstance(count, int) or count > 100_000:
                    raise ValueError("a repeat count must be an integer up to 100000")
            result = left + right if isinstance(node.op, ast.Add) else left * right
            if isinstance(result, (list, tuple)) and len(result) > 100_000:
                raise ValueError("the pattern is too long")
            return result
        raise ValueError(f"unsupported expression {ast.dump(node)[:40]}")

    result = fold(ast.parse(text, mode="eval").body)
    if isinstance(result, tuple) and len(result) == 1:
        result = result[0]
    if not isinstance(result, list) or not all(isinstance(x, int) for x in result):
        raise ValueError("the pattern must evaluate to a list of integers")
    return result


def _in_range(numbers: list[int]) -> None:
    if any(not INT_MIN <= n <= INT_MAX for n in numbers):
        raise ValueError(f"integers from {INT_MIN} to {INT_MAX}")


def _pattern_text(value: Any) -> Any:
    """Layer patterns are kept as the text Megatron reads; YAML integers become that text."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value) if value.bit_length() < 64 else "too large"
    if isinstance(value, str):
        try:
            pattern = layer_pattern(value)
            _in_range(pattern if isinstance(pattern, list) else [pattern])
        except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:
            raise ValueError(
                f"not a layer pattern (an integer or a list expression such as [1]*48): {exc}"
            ) from None
    return value


def _tuple_text(value: Any) -> Any:
    try:
        if isinstance(value, (list, tuple)):
            _in_range([int(v) for v in value])
            return ",".join(str(int(v)) for v in value)
        if isinstance(value, str):
            _in_range([int(v) for v in value.strip("()").split(",")])
    except (ValueError, TypeError):
        raise ValueError(
            f"expects integers separated by commas, e.g. 128,0 (from {INT_MIN} to {INT_MAX})"
        ) from None
    return value


_SCALARS = {"int": int, "float": float, "str": str, None: str, "lambda": str, "json": Any}


@dataclass(frozen=True)
class ArgumentRef:
    """A field whose type comes from a generated table entry (see `megatron()` / `relax_code()`)."""

    source: Literal["megatron", "relax"]
    dest: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def entry(self, name: str) -> dict[str, Any]:
        table = MEGATRON if self.source == "megatron" else RELAX
        dest = self.dest or name
        if dest not in table:
            raise KeyError(f"jobspec: {self.source} defines no argument with dest {dest!r}")
        return table[dest]

    def build(self, name: str) -> tuple[Any, Any]:
        """(annotation, pydantic FieldInfo) for the field `name`."""
        return field_from_entry(self.entry(name), self.source, **self.meta)


def megatron(**meta: Any) -> Any:
    """A Megatron-LM parameter documented by a hand-written group: type from the generated table.

    meta: help (replaces Megatron's text), ge/gt/le, path_kind, path_layout, unset, function_path.
    """
    return ArgumentRef("megatron", meta.pop("dest", None), meta)


def relax_code(**meta: Any) -> Any:
    """A flag of Relax's argument code, typed from the generated table."""
    return ArgumentRef("relax", meta.pop("dest", None), meta)


def field_from_entry(entry: dict[str, Any], source: str, **meta: Any) -> tuple[Any, Any]:
    """Annotation and FieldInfo for one argparse action read back from its parser."""
    action, tname, nargs = entry["action"], entry["type"], entry["nargs"]
    choices = entry.get("choices")
    default = _RESETS.get(entry["dest"], entry["default"]) if source == "megatron" else entry["default"]
    flags = list(entry["flags"])
    extra: dict[str, Any] = {
        "origin": "megatron" if source == "megatron" else "relax",
        "flag": flags[0],
        "source": source,
    }
    if source == "megatron" and entry["dest"] in _RESETS and _RESETS[entry["dest"]] != entry["default"]:
        extra["megatron_default"] = entry["default"]
    if entry.get("later"):
        extra["later"] = True
    if source == "relax":
        extra["versions"] = list(entry.get("versions", ()))
        if entry.get("changed"):
            extra["changed"] = entry["changed"]
        if entry.get("removed_in_main"):
            extra["removed_in_main"] = True
    annotation: Any
    if action in ("store_true", "store_false"):
        annotation = bool
        on = action == "store_true"
        default = (not on) if default is None else bool(default)
        extra["kind"] = "flag" if on else "flag_off"
        extra["switches"] = {f: on for f in flags}
    elif action == "boolean_optional":
        annotation = bool | None if default is None else bool
        extra["kind"] = "negatable"
        extra["switches"] = {**{f: True for f in flags}, **{f"no-{f}": False for f in flags}}
    elif action == "append":
        annotation = list[list[str]] | None
        extra["kind"] = "append"
        extra["nargs"] = nargs
    elif action == "store" and tname == "bool":
        annotation = bool | None if default is None else bool
        extra["kind"] = "bool_value"
    elif action == "store":
        item: Any = _SCALARS.get(tname, str)
        if choices:
            item = Literal[tuple(choices)]  # type: ignore[valid-type]
        if tname in _PATTERN_TYPES:
            item = Annotated[str, BeforeValidator(_pattern_text)]
            extra["pattern"] = "layers"
            default = None if default is None else str(default)
        elif tname == "tuple_type":
            item = Annotated[str, BeforeValidator(_tuple_text)]
            extra["pattern"] = "int_tuple"
        if choices:
            extra["choices"] = list(choices)
        if tname == "json":
            extra["kind"] = "json"
            annotation = Any
        elif nargs is None or nargs == "?":
            annotation = item
            extra["kind"] = {"int": "int", "float": "float"}.get(tname, "str")
        else:
            bounds = {k: meta.pop(k) for k in ("ge", "gt", "le") if meta.get(k) is not None}
            if bounds:
                item = Annotated[item, Field(**bounds)]
            annotation = list[item]  # type: ignore[valid-type]
            if isinstance(default, dict):
                default = [f"{k}={v}" for k, v in default.items()] or None
            elif default is not None and not isinstance(default, list):
                default = [default]  # argparse leaves a scalar default of a list flag as it is
            extra["kind"] = "list"
            extra["nargs"] = nargs
            extra["item_type"] = {"int": "int", "float": "float"}.get(tname, "str")
        if default is None and tname != "json":
            annotation = annotation | None
    else:  # pragma: no cover - a new argparse action must be taught to the codec
        raise TypeError(f"jobspec: no field for argparse action {action!r} ({entry['dest']})")
    if len(flags) > 1 and action not in ("store_true", "store_false", "boolean_optional"):
        extra["aliases"] = flags[1:]
    if entry.get("required"):
        extra["required_by_source"] = True
    for key in ("path_kind", "path_layout", "unset"):
        if meta.get(key) is not None:
            extra[key] = meta[key]
    if meta.get("function_path"):
        extra["function_path"] = True
    owner = "Megatron-LM" if source == "megatron" else "Relax"
    text = (
        meta.get("help") or entry["help"] or f"{owner}'s --{flags[0]} (its argument code gives no help text)."
    )
    kwargs: dict[str, Any] = {"description": text, "json_schema_extra": extra}
    for key in ("ge", "gt", "le"):
        if meta.get(key) is not None:
            kwargs[key] = meta[key]
    if tname == "float":  # argparse leaves a non-string default as written: `default=2**32`
        if isinstance(default, int) and not isinstance(default, bool):
            default = float(default)
        elif isinstance(default, list):
            default = [float(x) if isinstance(x, int) else x for x in default]
    if isinstance(default, (list, dict)):
        snapshot = default
        return annotation, Field(default_factory=lambda: type(snapshot)(snapshot), **kwargs)
    return annotation, Field(default=default, **kwargs)


def generated_group_specs(declared: set[str]) -> list[tuple[str, str, str, list[tuple[str, ArgumentRef]]]]:
    """(group id, title, description, [(field name, ref)]) for every table entry not in `declared`.

    Megatron's groups come first, in the order its parser adds them; then Relax's code sections.
    """
    out: list[tuple[str, str, str, list[tuple[str, ArgumentRef]]]] = []
    for source, table, prefix, label in (
        ("megatron", MEGATRON_ARGUMENTS, "megatron", "Megatron-LM"),
        ("relax", RELAX_ARGUMENTS, "relax", "Relax"),
    ):
        sections: dict[str, list[tuple[str, ArgumentRef]]] = {}
        placed: set[str] = set()
        for entry in table:
            if entry["dest"] in declared or entry["dest"] in placed:
                continue
            placed.add(entry["dest"])
            sections.setdefault(entry["group"] or "other", []).append(
                (entry["dest"], ArgumentRef(source, entry["dest"]))  # type: ignore[arg-type]
            )
        for title, refs in sections.items():
            slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
            description = (
                f"Megatron-LM's '{title}' arguments at 3714d81 (the commit Relax pins)."
                if source == "megatron"
                else f"Relax's '{title}' arguments, from its argument code (reference eb15c45 and main "
                f"{RELAX_MAIN})."
            )
            out.append((f"{prefix}-{slug}", f"{label}: {title}", description, refs))
    return out
