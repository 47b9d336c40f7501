"""Generate the job spec's argument tables from Megatron-LM's and Relax's own argument parsers.

    python -m tools.arguments.generate [--reference DIR] [--sglang-router DIR]

writes `jobspec/generated/arguments.py`: every flag Megatron-LM defines at the commit Relax pins, every
flag Relax's argument code defines (its reference commit and its current main), and the Megatron
defaults Relax resets. Nothing is typed by hand: the argument modules in `DIR` (default
`../shared/reference`, see its README) are executed with a real `argparse` parser, their imports of
packages that do not exist here (megatron.training, relax.*, sglang) answered by inert stand-ins, and
the parser's actions are read back (option strings, dest, action, type, nargs, choices, default, help).

Two argument sources are not in those modules and come from the JSON files beside this script, each
naming where its facts were read: the fields of Megatron's `TrainingConfig` / `ValidationConfig`
dataclasses (turned into flags here by the same rules as Megatron's `ArgumentGroupFactory`), and
Relax's `add_opd_arguments`. Relax's `--router-*` flags come from sglang-router's `RouterArgs`: pass
the unpacked wheel (`pip download --no-deps sglang-router`) with `--sglang-router`, or the router
entries of the current table are kept.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import pprint
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUTPUT = ROOT / "jobspec" / "generated" / "arguments.py"

MEGATRON_FILE = "megatron-lm_3714d81_training_arguments.py"
RELAX_FILES = {  # oldest first: a later version's definition of a flag wins
    "eb15c45": "relax_eb15c45_utils_arguments.py",
    "039ce87": "relax_039ce87_utils_arguments.py",
}
RELAX_MAIN = "039ce87"
LATER = "megatron_later_arguments.json"


# --------------------------------------------------------------------------------------------
# Inert stand-ins for the imports the argument modules make


class _Inert:
    """Any attribute, call, iteration or index of a package that cannot be imported here."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> _Inert:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(f"{self._name}()")

    def __iter__(self):
        return iter(())

    def __getitem__(self, item: Any) -> _Inert:
        return _Inert(f"{self._name}[{item!r}]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __repr__(self) -> str:
        return f"<inert {self._name}>"


class _InertModule(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports under `prefixes` that the real environment cannot satisfy with inert modules."""

    def __init__(self, prefixes: tuple[str, ...], overrides: dict[str, types.ModuleType]) -> None:
        self.prefixes = prefixes
        self.overrides = overrides

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in self.overrides:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname.split(".")[0] not in self.prefixes:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except (ImportError, AttributeError, ValueError):
                spec = None
            if spec is not None:
                return None  # the real module exists: let it load
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name in self.overrides:
            return self.overrides[spec.name]
        module = _InertModule(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextlib.contextmanager
def _stand_ins(finder: _Finder):
    """While active, imports under `finder.prefixes` that cannot be satisfied get inert modules."""
    sys.meta_path.insert(0, finder)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in finder.prefixes}
    for key in saved:
        del sys.modules[key]
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if k.split(".")[0] in finder.prefixes]:
            del sys.modules[key]
        sys.modules.update(saved)


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []  # type: ignore[attr-defined]
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


# --------------------------------------------------------------------------------------------
# Megatron's ArgumentGroupFactory rules, applied to dataclass facts (tools/arguments/*.json)


def _dataclass_arguments(group: Any, fields: list[dict[str, Any]]) -> None:
    """Add the flags Megatron's ArgumentGroupFactory derives from dataclass fields.

    The rules (megatron/training/argument_utils.py): `--<name>`; a bool defaulting to False is
    store_true, one defaulting to True is store_false spelled `--no-<name>` and `--disable-<name>`;
    `T | None` is T; `list[T]` takes nargs='+'; `Literal[...]` gives choices; a field's
    `argparse_meta` overrides what was inferred.
    """
    for f in fields:
        name, annotation = f["name"], f["type"]
        kwargs: dict[str, Any] = {"dest": name, "default": f["default"], "help": f["help"]}
        flags = ["--" + name.replace("_", "-")]
        inner = re.sub(r"\s*\|\s*None$", "", annotation)
        if inner == "bool":
            if f["default"] is False:
                kwargs["action"] = "store_true"
            else:
                kwargs["action"] = "store_false"
                flags = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
        elif inner.startswith("list["):
            kwargs["type"] = {"int": int, "float": float, "str": str}[inner[5:-1]]
            kwargs["nargs"] = "+"
        elif inner.startswith("Literal["):
            choices = ast.literal_eval("[" + inner[len("Literal[") : -1] + "]")
            kwargs["type"] = type(choices[0])
            kwargs["choices"] = choices
        elif inner in ("int", "float", "str"):
            kwargs["type"] = {"int": int, "float": float, "str": str}[inner]
        meta = dict(f.get("argparse_meta", {}))
        if meta.get("type") == "signal":
            meta["type"] = str
        kwargs.update(meta)
        group.add_argument(*flags, **kwargs)


class _ArgumentGroupFactory:
    """Stands in for megatron.training.argument_utils.ArgumentGroupFactory over the dataclass facts."""

    facts: dict[str, list[dict[str, Any]]] = {}

    def __init__(self, cfg_class: Any, exclude: list[str] | None = None) -> None:
        self.name = getattr(cfg_class, "_fact_name", None)
        self.exclude = set(exclude or ())

    def build_group(self, parser: argparse.ArgumentParser, title: str | None = None) -> Any:
        group = parser.add_argument_group(title=title)
        fields = [f for f in self.facts.get(self.name or "", []) if f["name"] not in self.exclude]
        _dataclass_arguments(group, fields)
        return group


def _fact_class(name: str) -> type:
    return type(name, (), {"_fact_name": name})


# --------------------------------------------------------------------------------------------
# Reading a parser back


def _type_name(action: argparse.Action) -> str | None:
    t = action.type
    if t is None:
        return None
    if t in (int, float, str, bool):
        return t.__name__
    if t is json.loads or getattr(t, "__name__", "") == "loads":
        return "json"
    name = getattr(t, "__name__", None) or type(t).__name__
    if name == "<lambda>":
        return "lambda"
    return name


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _action_kind(action: argparse.Action) -> str:
    name = type(action).__name__
    return {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "_StoreFalseAction": "store_false",
        "_StoreConstAction": "store_const",
        "_AppendAction": "append",
        "_AppendConstAction": "append_const",
        "_CountAction": "count",
        "BooleanOptionalAction": "boolean_optional",
    }.get(name, name)


def _help(text: Any) -> str:
    if not isinstance(text, str) or text == argparse.SUPPRESS:
        return ""
    return " ".join(text.split())


def _read_actions(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    titles = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            titles[id(action)] = group.title or ""
    out = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        entry: dict[str, Any] = {
            "dest": action.dest,
            "flags": [s[2:] for s in action.option_strings if s.startswith("--")],
            "action": _action_kind(action),
            "type": _type_name(action),
            "nargs": action.nargs,
            "default": _jsonable(action.default),
            "help": _help(action.help),
            "group": titles.get(id(action), ""),
        }
        if isinstance(action.default, str) and entry["type"] in ("int", "float", "json"):
            # argparse converts a string default with the action's type, as if it were given
            entry["default"] = _jsonable(action.type(action.default))
        if action.choices is not None:
            entry["choices"] = [_jsonable(c) for c in action.choices]
        if action.const is not None:
            entry["const"] = _jsonable(action.const)
        if action.required:
            entry["required"] = True
        if entry["action"] == "boolean_optional":
            entry["flags"] = [f for f in entry["flags"] if not f.startswith("no-")]
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------
# The sources


def _megatron_finder(facts: dict[str, list[dict[str, Any]]]) -> _Finder:
    _ArgumentGroupFactory.facts = facts
    overrides = {
        "megatron.training": _module("megatron.training"),
        "megatron.training.argument_utils": _module(
            "megatron.training.argument_utils", ArgumentGroupFactory=_ArgumentGroupFactory
        ),
        "megatron.training.config": _module(
            "megatron.training.config", **{name: _fact_class(name) for name in facts}
        ),
    }
    return _Finder(("megatron",), overrides)


def megatron_parser(reference: Path, facts: dict[str, list[dict[str, Any]]]) -> argparse.ArgumentParser:
    with _stand_ins(_megatron_finder(facts)):
        module = _load(reference / MEGATRON_FILE, "_megatron_arguments")
        parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
        return module.add_megatron_arguments(parser)


class _NoRouter:
    """sglang-router is not at hand: its flags are kept from the current table."""

    @staticmethod
    def add_cli_args(parser: Any, **kwargs: Any) -> None:
        return None


def _replay(parser: Any, calls: list[dict[str, Any]]) -> None:
    """`add_argument` calls written down as facts (the JSON files beside this script)."""
    for arg in calls:
        kwargs = {k: v for k, v in arg.items() if k != "flags"}
        if "type" in kwargs:
            kwargs["type"] = {"int": int, "float": float, "str": str}[kwargs["type"]]
        if kwargs.get("action") == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        parser.add_argument(*arg["flags"], **kwargs)


def _relax_finder(opd: list[dict[str, Any]], router_dir: Path | None) -> tuple[_Finder, bool]:
    def add_opd_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        _replay(parser, opd)
        return parser

    overrides = {
        "relax": _module("relax"),
        "relax.utils": _module("relax.utils"),
        "relax.utils.device": _module("relax.utils.device", get_dist_backend=lambda: "nccl"),
        "relax.utils.opd": _module("relax.utils.opd"),
        "relax.utils.opd.opd_utils": _module(
            "relax.utils.opd.opd_utils",
            add_opd_arguments=add_opd_arguments,
            is_managed_opd_teacher_enabled=lambda *a, **k: False,
            teacher_sglang_parse_args=lambda *a, **k: None,
            validate_managed_opd_teacher_colocate_args=lambda *a, **k: None,
            validate_opd_args=lambda *a, **k: None,
        ),
    }
    router_args = None
    if router_dir is not None:
        sys.path.insert(0, str(router_dir))
        try:
            from sglang_router.router_args import RouterArgs  # type: ignore[import-not-found]

            router_args = RouterArgs
        finally:
            sys.path.remove(str(router_dir))
    if router_args is None:
        router_args = _NoRouter
    overrides["sglang_router"] = _module("sglang_router")
    overrides["sglang_router.launch_router"] = _module("sglang_router.launch_router", RouterArgs=router_args)
    return _Finder(("relax", "sglang_router", "sglang"), overrides), router_args is not _NoRouter


def _pre_parse_arguments(module: types.ModuleType) -> list[dict[str, Any]]:
    """The flags Relax reads in `_pre_parse_mode` with a parser of its own."""
    captured: list[argparse.ArgumentParser] = []

    class _Capturing(argparse.ArgumentParser):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            captured.append(self)

        def parse_known_args(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
            return argparse.Namespace(), []

    shim = types.SimpleNamespace(**{k: getattr(argparse, k) for k in dir(argparse) if not k.startswith("__")})
    shim.ArgumentParser = _Capturing
    real = module.__dict__["argparse"]
    module.__dict__["argparse"] = shim
    try:
        module._pre_parse_mode()
    finally:
        module.__dict__["argparse"] = real
    return [a for p in captured for a in _read_actions(p)]


def _section(function: str, title: str) -> str:
    """Relax adds its flags in one `add_<section>_arguments` function per section; sglang-router in
    titled groups."""
    m = re.fullmatch(r"add_(.+?)(?:_arguments|_args)?", function)
    if m and m.group(1) not in ("cli", "argument"):
        return m.group(1).replace("_", " ")
    return title


def relax_arguments(
    reference: Path,
    version: str,
    facts: dict[str, list[dict[str, Any]]],
    opd: list[dict[str, Any]],
    router_dir: Path | None,
) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """(Relax's own flags, {Megatron dest: Relax's default}, whether router flags were read)."""
    parser = megatron_parser(reference, facts)
    before = {(a["dest"], tuple(a["flags"])): a for a in _read_actions(parser)}
    finder, has_router = _relax_finder(opd, router_dir)
    callers: dict[str, str] = {}
    real_add = parser.add_argument

    def add_argument(*flags: Any, **kwargs: Any) -> Any:
        action = real_add(*flags, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_name.startswith("add_"):
            frame = frame.f_back
        callers[action.dest] = frame.f_code.co_name if frame is not None else ""
        return action

    parser.add_argument = add_argument  # type: ignore[method-assign]
    with _stand_ins(finder):
        module = _load(reference / RELAX_FILES[version], f"_relax_{version}")
        parser = module.get_slime_extra_args_provider()(parser)
    del parser.add_argument
    own, resets = [], {}
    for entry in _read_actions(parser):
        old = before.get((entry["dest"], tuple(entry["flags"])))
        if old is not None:
            if old["default"] != entry["default"]:
                resets[entry["dest"]] = entry["default"]
            continue
        entry["group"] = _section(callers.get(entry["dest"], ""), entry["group"])
        if entry["dest"] not in callers:
            # added to argument groups of its own by sglang-router's RouterArgs.add_cli_args
            entry["package"] = "sglang-router"
        own.append(entry)
    for entry in _pre_parse_arguments(module):
        entry["group"] = "pre-parse"
        own.append(entry)
    return own, resets, has_router


# --------------------------------------------------------------------------------------------


def generate(reference: Path, router_dir: Path | None) -> dict[str, Any]:
    facts = json.loads((HERE / "megatron_dataclass_fields.json").read_text())["classes"]
    opd = json.loads((HERE / "relax_opd_arguments.json").read_text())["arguments"]
    megatron = _read_actions(megatron_parser(reference, facts))
    pinned = {flag for entry in megatron for flag in entry["flags"]}
    later = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _replay(
        later.add_argument_group(title="later Megatron-LM"),
        json.loads((HERE / LATER).read_text())["arguments"],
    )
    for entry in _read_actions(later):
        if not set(entry["flags"]) & pinned:
            entry["later"] = True
            megatron.append(entry)
    relax: dict[str, dict[str, Any]] = {}
    resets: dict[str, dict[str, Any]] = {}
    has_router = False
    for version in RELAX_FILES:
        own, reset, has_router = relax_arguments(reference, version, facts, opd, router_dir)
        for entry in own:
            previous = relax.get(entry["dest"])
            entry["versions"] = [*previous["versions"], version] if previous else [version]
            if previous is not None:
                changed = sorted(
                    k
                    for k in ("flags", "action", "type", "nargs", "default", "choices")
                    if previous.get(k) != entry.get(k)
                )
                if changed:
                    entry["changed"] = {k: previous.get(k) for k in changed}
            relax[entry["dest"]] = entry
        resets[version] = reset
    for entry in relax.values():
        if RELAX_MAIN not in entry["versions"]:
            entry["removed_in_main"] = True
    if not has_router:
        kept = [e for e in _current().get("RELAX_ARGUMENTS", ()) if e.get("package") == "sglang-router"]
        for entry in kept:
            relax.setdefault(entry["dest"], entry)
    return {
        "MEGATRON_ARGUMENTS": megatron,
        "RELAX_ARGUMENTS": sorted(relax.values(), key=lambda e: (e["group"], e["dest"])),
        "RELAX_MEGATRON_DEFAULTS": resets,
    }


def _current() -> dict[str, Any]:
    if not OUTPUT.exists():
        return {}
    namespace: dict[str, Any] = {}
    exec(compile(OUTPUT.read_text(), str(OUTPUT), "exec"), namespace)
    return namespace


HEADER = '''"""Generated by `python -m tools.arguments.generate`; do not edit.

Megatron-LM's arguments at 3714d81 (the commit Relax pins) and Relax's own argument code at eb15c45
(its configuration reference) and 039ce87 (its main), read back from their argparse parsers. Each entry:
dest, flags (without "--"), action, type, nargs, default, help, group (argparse group title), and
where present choices, const, required; Relax entries also list the versions that define them, what
changed between them, and whether main removed them. `RELAX_MEGATRON_DEFAULTS` holds, per Relax
version, the Megatron defaults Relax's parser resets.
"""

SOURCES = {sources}
'''


def render(tables: dict[str, Any]) -> str:
    sources = {
        "megatron": "Megatron-LM megatron/training/arguments.py @ 3714d81",
        "relax": {v: f"Relax relax/utils/arguments.py @ {v}" for v in RELAX_FILES},
        "relax_main": RELAX_MAIN,
    }
    text = HEADER.format(sources=pprint.pformat(sources, width=110))
    for name, value in tables.items():
        text += f"\n{name} = {pprint.pformat(value, width=110, sort_dicts=True)}\n"
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "reference")
    parser.add_argument("--sglang-router", type=Path, default=None, help="an unpacked sglang-router wheel")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table is stale")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # megatron-core's notes about missing TransformerEngine/Apex
    text = render(generate(args.reference, args.sglang_router))
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: run python -m tools.arguments.generate",
                file=sys.stderr,
            )
            raise SystemExit(1)
        return
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    tables = _current()
    print(
        f"wrote {OUTPUT.relative_to(ROOT)}: {len(tables['MEGATRON_ARGUMENTS'])} Megatron arguments, "
        f"{len(tables['RELAX_ARGUMENTS'])} Relax arguments"
    )


if __name__ == "__main__":
    main()
