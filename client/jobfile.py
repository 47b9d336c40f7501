"""Reads job files: YAML/JSON with `name`, `queue`, … and a `spec` object or `args` flags; a
launch script (`.sh`) is run by bash on this machine to find its training command
(client/launch_script.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from client.launch_script import DEFAULT_TIMEOUT_S, ResolvedScript, resolve_launch_script

SCRIPT_SUFFIXES = (".sh", ".bash")

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
    launch_script: ResolvedScript | None = None


class JobFileError(ValueError):
    pass


def is_launch_script(path: Path) -> bool:
    return path.suffix in SCRIPT_SUFFIXES


def load_job_file(
    path: Path,
    *,
    script_env: Mapping[str, str] | None = None,
    script_args: Sequence[str] = (),
    inherit_env: bool = False,
    script_timeout: float = DEFAULT_TIMEOUT_S,
) -> JobFile:
    """A file with `spec:` (or `args:`) is a job envelope; any other mapping is a bare Relax config;
    a `.sh` file is a Relax launch script: bash runs it here, in a scratch environment, and its
    training command's flags are the job's `args` (raises LaunchScriptError when it has none)."""
    if is_launch_script(path):
        resolved = resolve_launch_script(
            path, env=script_env, script_args=script_args, timeout_s=script_timeout, inherit_env=inherit_env
        )
        return JobFile(name=resolved.job_name, args=resolved.argv, launch_script=resolved)
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
