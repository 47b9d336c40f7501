"""The range of every value in a job spec, and the limits of a spec's size, stated once.

A parameter's declaration may state its range (`param(..., ge=1)`, `megatron(ge=1)`). Where it states no
upper end, or no lower end, the range comes from the kind of number it is (`number_range`):

- a byte size (`size=True`) is 0 .. 1 TiB;
- a GPU count of one node or one engine (`*_gpus_per_node`, `*_gpus_per_engine`) is at most
  `MAX_GPUS_PER_NODE`, the most a node of any pool may have (the admin API uses the same bound);
- any other count of GPUs or nodes (`*_gpus`, `*_nodes`, and the numbers of `--resource`) is at most
  `MAX_DEMAND_GPUS`, beyond any cluster;
- a port is at most 65535;
- every other integer fits 32 bits (`INT_MAX`), what Megatron-LM, SGLang and their kernels read counts into;
- an integer is non-negative unless its declaration says otherwise or its default is a negative sentinel
  (`-1`: then that sentinel is the lower end);
- a float is finite and at most `FLOAT_MAX` in magnitude.

Strings: a path (`path_kind`) or a dotted code path is at most `MAX_PATH_LENGTH` characters (PATH_MAX);
any other string, and the JSON text of a JSON parameter, at most `MAX_WORD_LENGTH`, so that it fits one
word of the Relax command line the job runs (Linux refuses a longer word: MAX_ARG_STRLEN, 128 KiB).

Why: a number without an upper end reached the runtime as given (`rollout-batch-size 1e100` was accepted
and its driver grew to 2.5 GB), and a spec's size was bounded by nothing (120,000 unknown keys took 71 s
to judge). The ranges are enforced by the pydantic model, so they appear in its JSON schema (`relaxctl spec
schema`) and in the issue (`spec.out_of_range`, naming the flag, with the range as hint).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = [
    "INT_MIN",
    "INT_MAX",
    "FLOAT_MAX",
    "BYTES_MAX",
    "PORT_MAX",
    "MAX_GPUS_PER_NODE",
    "MAX_DEMAND_GPUS",
    "MAX_PATH_LENGTH",
    "MAX_WORD_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_SPEC_KEYS",
    "MAX_ARGV_WORDS",
    "MAX_SUGGESTIONS",
    "number_range",
    "number_kind",
    "string_kind",
    "unwrap_optional",
    "json_skeleton",
    "json_too_deep",
    "untyped_problem",
    "shown",
]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
#: The largest magnitude at which a double still counts integers exactly (2^53).
FLOAT_MAX = float(2**53)
BYTES_MAX = 2**40  # 1 TiB: no buffer or memory margin of one process is larger
PORT_MAX = 65535
#: GPUs (or slots) of one node: a node of a pool (`PUT /v1/pools/{pool}/nodes/{node}`) and a spec's
#: per-node and per-engine GPU counts. The scheduling pass sizes its tables by it.
MAX_GPUS_PER_NODE = 1024
#: GPUs of one job (or a queue's quota): beyond any cluster.
MAX_DEMAND_GPUS = 100_000
MAX_PATH_LENGTH = 4096  # Linux's PATH_MAX
MAX_WORD_LENGTH = 32_768  # characters: at most 128 KiB of UTF-8, Linux's MAX_ARG_STRLEN
#: Nesting of any JSON the platform reads: a spec's JSON parameters, a request body.
MAX_JSON_DEPTH = 32
#: Keys of one spec object (and of its SGLang mapping). A spec names each of its ~1,100 parameters once;
#: the rest is room for --sglang-* flags.
MAX_SPEC_KEYS = 2048
#: Words of one Relax command line (`args`): a flag and its values, list flags with several.
MAX_ARGV_WORDS = 4 * MAX_SPEC_KEYS
#: Unknown keys that get a did-you-mean (each costs a search over every flag); later ones get none.
MAX_SUGGESTIONS = 20

_GPUS_PER_UNIT = re.compile(r"gpus_per_(node|engine)$")
_GPU_OR_NODE_COUNT = re.compile(r"(^|_)(gpus|nodes)(_|$)")
_PORT = re.compile(r"(^|_)port$")


def unwrap_optional(annotation: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def number_range(
    name: str,
    number: type,
    default: Any,
    *,
    size: bool = False,
    ge: Any = None,
    gt: Any = None,
    le: Any = None,
) -> dict[str, Any]:
    """The bounds (`ge`, `le`) a number parameter gets where its declaration states none; only the missing
    ends. `number` is int or float; `default` is the parameter's default (for a list, None)."""
    out: dict[str, Any] = {}
    if number is float:
        if ge is None and gt is None:
            out["ge"] = -FLOAT_MAX
        if le is None:
            out["le"] = FLOAT_MAX
        return out
    if ge is None and gt is None:
        sentinel = default if isinstance(default, int) and not isinstance(default, bool) else 0
        out["ge"] = min(0, sentinel)
    if le is None:
        if size:
            out["le"] = BYTES_MAX
        elif _GPUS_PER_UNIT.search(name):
            out["le"] = MAX_GPUS_PER_NODE
        elif _GPU_OR_NODE_COUNT.search(name):
            out["le"] = MAX_DEMAND_GPUS
        elif _PORT.search(name):
            out["le"] = PORT_MAX
        else:
            out["le"] = INT_MAX
    return out


def _plain(annotation: Any) -> Any:
    """`Annotated[X, ...]` -> X."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def number_kind(annotation: Any) -> tuple[type | None, bool]:
    """(int or float, whether it is a list's item type) for a number parameter's annotation, else (None, _)."""
    inner = _plain(unwrap_optional(annotation))
    if inner in (int, float):
        return inner, False
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner) or (None,)
        if _plain(item) in (int, float):
            return _plain(item), True
    return None, False


def string_kind(annotation: Any) -> tuple[bool, bool]:
    """(whether it is a string or a list of strings, whether a list) for a parameter's annotation."""
    inner = _plain(unwrap_optional(annotation))
    if inner is str:
        return True, False
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner) or (None,)
        return _plain(item) is str, True
    return False, False


_JSON_STRING_BYTES = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_NOT_BRACKETS = bytes(set(range(256)) - _OPEN - _CLOSE)


def json_skeleton(text: str | bytes) -> bytes:
    """JSON text without the contents of its strings (each string becomes ""), to read its structure
    without parsing it."""
    raw = text.encode() if isinstance(text, str) else text
    return _JSON_STRING_BYTES.sub(b'""', raw)


def json_too_deep(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays and objects deeper than `limit`, read without parsing it (a parser
    recurses: Python's fails with RecursionError near 1,000 levels). Text that is not JSON is judged as
    far as it goes; the parser then refuses it."""
    brackets = json_skeleton(text).translate(None, _NOT_BRACKETS)
    if len(brackets) <= 2 * limit:
        return False
    depth = 0
    for byte in brackets:
        depth += 1 if byte in _OPEN else -1
        if depth > limit:
            return True
    return False


def untyped_problem(value: Any) -> str | None:
    """What is wrong with an untyped value (a JSON parameter, an SGLang passthrough value), or None: nested
    deeper than MAX_JSON_DEPTH, a number out of its range (INT_MIN..INT_MAX, finite and FLOAT_MAX), a string
    longer than MAX_WORD_LENGTH. Walked without recursion, so any depth is judged."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                return f"holds the integer {shown(item)}, outside {INT_MIN}..{INT_MAX}"
        elif isinstance(item, float):
            if not -FLOAT_MAX <= item <= FLOAT_MAX:  # NaN compares false too
                return f"holds the number {item!r}, not finite or beyond {FLOAT_MAX:.0f} in magnitude"
        elif isinstance(item, str):
            if len(item) > MAX_WORD_LENGTH:
                return f"holds a string of {len(item)} characters, more than {MAX_WORD_LENGTH}"
        elif isinstance(item, Mapping):
            stack.extend((k, depth + 1) for k in item.keys())
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return None


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters, for messages that echo what was given."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return (
            f"an integer of {len(str(abs(value)))} digits"
            if value.bit_length() < 14_000
            else "a huge integer"
        )
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} characters)"
