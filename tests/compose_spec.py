"""compose.yaml as the tests read it: its services with Compose's variable interpolation applied (`${VAR}`,
`${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `$$`) from .env.example and overrides. No Docker engine runs
here: tests/unit/test_compose_file.py checks the file's structure, tests/integration/test_compose_topology.py runs
its services' commands as local processes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"

_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class MissingVariable(ValueError):
    pass


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and # comments skipped."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path.name}: {line!r} is not KEY=VALUE")
        env[key.strip()] = value.strip()
    return env


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """`value` (a string, or lists and maps of them) with Compose's variables replaced from `env`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        present = name in env
        empty = not env.get(name)
        if op in (":-", "-"):
            unset = empty if op == ":-" else not present
            return arg if unset else env[name]
        if op in (":?", "?"):
            unset = empty if op == ":?" else not present
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        return env.get(name, "")

    return _VAR.sub(one, value)


def load(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file, YAML anchors and merge keys resolved, variables interpolated from `env` (default:
    .env.example's values)."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate(raw, read_env_file() if env is None else env)


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment` (a map or a list of KEY=VALUE) as a map of strings."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def image_env(target: str) -> dict[str, str]:
    """The `ENV` of a Dockerfile stage and of the stages it is built `FROM` (a container's environment before
    the service's own)."""
    stages: dict[str, tuple[str, dict[str, str]]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            current = m.group(2)
            stages[current] = (m.group(1), {})
        elif line.startswith("ENV ") and current:
            stages[current][1].update(re.findall(r"(\w+)=(\S+)", line))
    env: dict[str, str] = {}
    while target in stages:
        base, own = stages[target]
        env = own | env
        target = base
    return env


def entrypoint_roles() -> set[str]:
    """The roles docker/entrypoint.sh's `case` knows (its `a|b)` arms), without the catch-all."""
    text = ENTRYPOINT.read_text()
    body = text[text.index('case "$role" in') : text.index("esac")]
    roles: set[str] = set()
    for arm in re.findall(r"^\s{2}([a-z|-]+)\)", body, flags=re.M):
        roles.update(arm.split("|"))
    return roles
