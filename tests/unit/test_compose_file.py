"""compose.yaml's structure (no Docker engine runs here; tests/integration/test_compose_topology.py runs its services'
commands as processes): the services issue 14 names, their images and entrypoint roles, a sane depends_on graph,
one database, broker and volume for all, and settings that the production checks accept."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from api.app import WEB_DIST
from scheduler.settings import Settings
from tests.compose_spec import (
    ENV_EXAMPLE,
    ROOT,
    MissingVariable,
    entrypoint_roles,
    environment,
    load,
    read_env_file,
)

SERVICES = load()["services"]
OUR_IMAGES = ("relax-platform:", "relax-ray:")
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _ours(name: str) -> bool:
    return str(SERVICES[name].get("image", "")).startswith(OUR_IMAGES)


def _role(name: str) -> str:
    return SERVICES[name]["command"][0]


def _by_role(role: str) -> list[str]:
    return sorted(n for n in SERVICES if _ours(n) and _role(n) == role)


def _depends(name: str) -> dict[str, Any]:
    deps = SERVICES[name].get("depends_on") or {}
    return {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps


def test_every_service_the_issue_names_is_there() -> None:
    assert {"postgres", "redis", "migrate", "ray-head", "ray-worker"} <= set(SERVICES)
    assert len(_by_role("api")) == 2 and len(_by_role("scheduler")) == 2
    assert _by_role("migrate") == ["migrate"] and _by_role("register-pool") == ["register-pool"]
    (worker,) = _by_role("worker")
    pool = environment(SERVICES["register-pool"])["RELAX_POOL"]
    assert SERVICES[worker]["command"] == ["worker", pool]  # the worker serves the pool that is registered
    assert _by_role("ray-head") == ["ray-head"] and _by_role("ray-worker") == ["ray-worker"]


def test_images_and_entrypoint_roles() -> None:
    roles = entrypoint_roles()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.M))
    for name, svc in SERVICES.items():
        assert svc.get("image"), name
        if not _ours(name):
            continue
        assert _role(name) in roles, f"{name}: role {_role(name)!r} not in docker/entrypoint.sh"
        assert svc["build"]["target"] in targets, name
        want = "ray" if svc["image"].startswith("relax-ray:") else "platform"
        assert svc["build"]["target"] == want, name


def test_docker_build_without_a_target_gives_the_control_plane() -> None:
    # `docker build .` builds the last stage: the platform's, not the Ray node's (found running it under Docker)
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", DOCKERFILE, flags=re.M)
    assert stages[-1][1] == "platform"


def test_every_long_running_service_has_a_health_check_of_its_own_role() -> None:
    # the platform image's HEALTHCHECK asks an API port: a scheduler or pool worker under it would be reported
    # unhealthy forever (the pool worker was, under Docker); one-shots exit and need none
    assert "HEALTHCHECK" in DOCKERFILE and "/healthz" in DOCKERFILE
    for name, svc in SERVICES.items():
        if not _ours(name) or _role(name) in ("api", "migrate", "register-pool", "ray-worker"):
            continue
        test = " ".join(svc.get("healthcheck", {}).get("test", []))
        if _role(name) in ("scheduler", "worker"):
            assert "inspect ping" in test, (name, test)
        else:
            assert test, name


def test_depends_on_graph_is_sane() -> None:
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name in SERVICES:
        for dep, spec in _depends(name).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert spec["condition"] in conditions, (name, dep)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (
                    f"{name} waits for {dep} to be healthy: it has no check"
                )
            if spec["condition"] == "service_completed_successfully":
                assert SERVICES[dep].get("restart") == "no", f"{dep} is a one-shot: restart must be 'no'"
    # acyclic: a topological order exists
    done: set[str] = set()
    while len(done) < len(SERVICES):
        ready = [n for n in SERVICES if n not in done and set(_depends(n)) <= done]
        assert ready, f"a cycle among {sorted(set(SERVICES) - done)}"
        done.update(ready)
    # the control plane starts on a migrated database and a healthy broker
    for name in _by_role("api") + _by_role("scheduler") + _by_role("worker"):
        deps = _depends(name)
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    assert _depends("migrate")["postgres"]["condition"] == "service_healthy"
    assert _depends("ray-worker")["ray-head"]["condition"] == "service_healthy"


def test_one_database_broker_secret_and_volume_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = [n for n in SERVICES if _ours(n) and SERVICES[n]["image"].startswith("relax-platform:")]
    shared = {
        "RELAX_DATABASE_URL",
        "RELAX_BROKER_URL",
        "RELAX_SECRET_KEY",
        "RELAX_HOME",
        "RELAX_ARTIFACT_ROOT",
    }
    control = [n for n in platform if _role(n) != "register-pool"]  # that one only speaks HTTP
    values = {k: {environment(SERVICES[n])[k] for n in control} for k in shared}
    assert all(len(v) == 1 for v in values.values()), values
    assert "@postgres:" in next(iter(values["RELAX_DATABASE_URL"]))
    assert next(iter(values["RELAX_BROKER_URL"])).startswith("redis://redis:")
    home = next(iter(values["RELAX_HOME"]))
    for name in control + _by_role("ray-head") + _by_role("ray-worker"):
        env = environment(SERVICES[name])
        assert env["RELAX_HOME"] == home, name
        volumes = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
        assert volumes.get(home) == "relax-home", f"{name}: RELAX_HOME is not the shared volume"
    for name in control:
        for key, value in environment(SERVICES[name]).items():
            monkeypatch.setenv(key, value)
        Settings()  # the production checks pass (a real database, broker and secret key)
    # replicas keep apart what they must not share: their metrics folders and their beats' state files
    names = [environment(SERVICES[n]).get("RELAX_METRICS_NAME") for n in control if _role(n) != "migrate"]
    assert None not in names and len(set(names)) == len(names), names
    for name in _by_role("scheduler"):
        assert not environment(SERVICES[name])["RELAX_BEAT_SCHEDULE_FILE"].startswith(home), name


def test_one_published_port_in_front_of_both_api_replicas() -> None:
    published = [n for n, s in SERVICES.items() if s.get("ports")]
    assert published == ["proxy"]
    conf = (ROOT / "docker" / "nginx.conf").read_text()
    mounted = [v for v in SERVICES["proxy"]["volumes"] if v.startswith("./docker/nginx.conf:")]
    assert mounted
    upstream = set(re.findall(r"^\s*server\s+([\w-]+):(\d+)", conf, flags=re.M))
    assert upstream == {(n, "8400") for n in _by_role("api")}
    assert {d for d, s in _depends("proxy").items() if s["condition"] == "service_healthy"} == set(
        _by_role("api")
    )
    # the drivers on the Ray nodes report to the API through the proxy
    assert environment(SERVICES["api-1"])["RELAX_PUBLIC_URL"] == "http://proxy:8400"


def test_the_ray_cluster_is_the_registered_pool() -> None:
    env = environment(SERVICES["register-pool"])
    assert env["RELAX_POOL_RAY_ADDRESS"] == "http://ray-head:8265"  # docker/entrypoint.sh: --dashboard-port
    assert env["RELAX_URL"].removeprefix("http://").split(":")[0] in _by_role("api")
    spec = importlib.util.spec_from_file_location("register_pool", ROOT / "docker" / "register_pool.py")
    assert spec and spec.loader
    register_pool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(register_pool)
    nodes = register_pool.parse_nodes(env["RELAX_POOL_NODES"])
    # the nodes registered are the Ray nodes' names (--node-name): node sync binds them to Ray's ids
    ray_names = {environment(SERVICES[n])["RELAX_RAY_NODE_NAME"] for n in ("ray-head", "ray-worker")}
    assert set(nodes) == ray_names
    with pytest.raises(SystemExit, match="RELAX_POOL_NODES: 'ray-worker' is not NAME=SLOTS"):
        register_pool.parse_nodes("ray-worker")
    for name in ("ray-head", "ray-worker"):
        assert environment(SERVICES[name])["RELAX_POOL"] == env["RELAX_POOL"]


def test_the_secrets_must_be_set() -> None:
    example = read_env_file(ENV_EXAMPLE)
    for key in ("POSTGRES_PASSWORD", "RELAX_SECRET_KEY", "RELAX_BOOTSTRAP_ADMIN_KEY"):
        with pytest.raises(MissingVariable, match=key):
            load({k: v for k, v in example.items() if k != key})


def test_the_image_serves_the_dashboard() -> None:
    # api/app.py serves <the api package's parent>/web/dist; the image builds it and links it there
    assert WEB_DIST.relative_to(ROOT) == Path("web/dist")
    assert re.search(r"^FROM node:\S+ AS web$", DOCKERFILE, flags=re.M)
    assert "RUN npm run build" in DOCKERFILE
    assert "COPY --from=web /src/web/dist /opt/relax/web/dist" in DOCKERFILE
    assert "pathlib.Path(api.__file__).resolve().parents[1])')/web\"" in DOCKERFILE
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "web/node_modules", ".env"} <= set(ignored)
