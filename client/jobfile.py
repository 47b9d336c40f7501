"""Reads job files: YAML/JSON with `name`, `queue`, … and a `spec` object or `args` flags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_ENVELOPE_KEYS = {"name", "queue", "team", "priority-class", "priority_class", "labels", "spec", "args"}


@dataclass
class JobFile:
    name: str | None = None
    queue: str | None = None
    team: str | None = None
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    args: list[str] | str | None = None


class JobFileError(ValueError):
    pass


def _from_launch_script(path: Path, text: str, env: dict[str, str] | None) -> JobFile:
    from jobspec import SpecError, parse_launch_script

    try:
        argv = parse_launch_script(text, env=env)
    except SpecError as err:
        lines = "\n".join(f"  - {i.field or ''}: {i.message} (hint: {i.hint})" for i in err.errors)
        raise JobFileError(f"{path}: cannot read the Relax flags of this launch script:\n{lines}") from None
    return JobFile(name=path.stem, args=argv)


def load_job_file(path: Path, *, script_env: dict[str, str] | None = None) -> JobFile:
    """A file with `spec:` (or `args:`) is a job envelope; any other mapping is a bare Relax config;
    a `.sh` file is a Relax launch script, whose flags are read as they are."""
    try:
        text = path.read_text()
    except OSError as err:
        raise JobFileError(f"cannot read {path}: {err.strerror}") from None
    if path.suffix in (".sh", ".bash"):
        return _from_launch_script(path, text, script_env)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise JobFileError(f"{path} is not valid YAML/JSON: {err}") from None
    if not isinstance(data, dict):
        raise JobFileError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    if "spec" not in data and "args" not in data:
        return JobFile(spec=data)
    unknown = set(data) - _ENVELOPE_KEYS
    if unknown:
        raise JobFileError(
            f"{path}: unknown top-level key(s) {sorted(unknown)}; a job file has {sorted(_ENVELOPE_KEYS)} "
            "(Relax parameters go under `spec:`)"
        )
    return JobFile(
        name=data.get("name"),
        queue=data.get("queue"),
        team=data.get("team"),
        priority_class=data.get("priority-class", data.get("priority_class")),
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        spec=data.get("spec"),
        args=data.get("args"),
    )
