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


def load_job_file(path: Path) -> JobFile:
    """A file with `spec:` (or `args:`) is a job envelope; any other mapping is a bare Relax config."""
    try:
        text = path.read_text()
    except OSError as err:
        raise JobFileError(f"cannot read {path}: {err.strerror}") from None
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
