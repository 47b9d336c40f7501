"""The engine server's API key: every route refuses a request without the key or with a wrong one (401, and
nothing changes: a forged weight update leaves the weights as they were), the key reaches the server in a
`--config` file (never on its command line) and is never reported back, and the runtime's client and
`HttpRolloutEngine` send it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from runtime.models.tiny import build_tiny_model
from runtime.rollout.engine import SamplingParams
from runtime.rollout.sglang.client import SGLangClient, SGLangEngineError
from runtime.rollout.sglang.engine_actor import (
    REPO_ROOT,
    HttpRolloutEngine,
    engine_host,
    engine_secret,
    free_port,
    write_server_config,
)
from runtime.rollout.sglang.server import ServerArgs, build_serving, create_app, parse_args
from runtime.rollout.sglang.serving import ServingEngine
from runtime.rollout.sglang.tensor_payload import RELAX_SAFETENSORS_FORMAT, encode_named_tensors

KEY = engine_secret()
GOOD = {"Authorization": f"Bearer {KEY}"}
WRONG = [{}, {"Authorization": f"Bearer {engine_secret()}"}, {"Authorization": KEY}, {"X-Api-Key": KEY}]


@pytest.fixture
def serving(tiny_model: Path) -> ServingEngine:
    return build_serving(ServerArgs(model_path=str(tiny_model)))


@pytest.fixture
def client(serving: ServingEngine, tiny_model: Path) -> Iterator[TestClient]:
    with TestClient(create_app(serving, ServerArgs(model_path=str(tiny_model), api_key=KEY))) as c:
        yield c


def _weights(serving: ServingEngine) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in serving.model.state_dict().items()}


def test_every_route_refuses_a_missing_or_wrong_key(client: TestClient) -> None:
    routes = [(m, r.path) for r in client.app.routes if isinstance(r, APIRoute) for m in r.methods]
    assert {"/health", "/generate", "/update_weights_from_tensor", "/flush_cache"} <= {p for _, p in routes}
    for method, path in [*routes, ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/nowhere")]:
        for headers in WRONG:
            response = client.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert KEY not in response.text and response.headers["www-authenticate"] == "Bearer"
    assert client.get("/health", headers=GOOD).status_code == 200
    info = client.get("/get_server_info", headers=GOOD).json()
    assert "api_key" not in info and KEY not in str(info)


def test_a_forged_weight_update_is_refused_and_changes_nothing(
    client: TestClient, serving: ServingEngine, tiny_model: Path, tmp_path: Path
) -> None:
    before = _weights(serving)
    forged = {name: torch.zeros_like(t) for name, t in before.items()}
    body = {
        "serialized_named_tensors": [encode_named_tensors(forged)],
        "load_format": RELAX_SAFETENSORS_FORMAT,
        "weight_version": "666",
    }
    other = build_tiny_model(tmp_path / "other", seed=3)
    for headers in WRONG:
        assert client.post("/update_weights_from_tensor", json=body, headers=headers).status_code == 401
        disk = {"model_path": str(other), "weight_version": "667"}
        assert client.post("/update_weights_from_disk", json=disk, headers=headers).status_code == 401
        assert (
            client.post("/update_weight_version", json={"new_version": "9"}, headers=headers).status_code
            == 401
        )
        assert client.post("/release_memory_occupation", json={}, headers=headers).status_code == 401
    after = _weights(serving)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert serving.weight_version == "default"
    assert serving.memory_state()["weights"] == "resident"

    # The same update with the key goes through: the refusal was the key, not the body.
    response = client.post("/update_weights_from_tensor", json=body, headers=GOOD)
    assert response.status_code == 200 and response.json()["success"], response.text
    assert serving.weight_version == "666"
    assert all(torch.count_nonzero(t) == 0 for t in _weights(serving).values())


def test_the_key_comes_from_a_config_file_and_the_command_line_wins(tmp_path: Path) -> None:
    config = write_server_config(tmp_path, KEY)
    assert config.stat().st_mode & 0o777 == 0o600
    args = parse_args(["--model-path", "m", "--config", str(config), "--port", "31000"])
    assert (args.api_key, args.port, args.host) == (KEY, 31000, "127.0.0.1")
    assert KEY not in repr(args)
    assert parse_args(["--config", str(config), "--model-path", "m", "--api-key", "other-key"]).api_key == (
        "other-key"
    )
    with pytest.raises(ValueError, match="YAML"):
        parse_args(["--model-path", "m", "--config", str(tmp_path / "c.json")])


def test_engine_host_is_loopback_or_this_node() -> None:
    assert engine_host() == "127.0.0.1"
    assert engine_host("::1") == "::1"
    for wildcard in ("0.0.0.0", "::", "192.0.2.99"):
        with pytest.raises(ValueError, match="this node's own address"):
            engine_host(wildcard)


@pytest.fixture(scope="module")
def keyed_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A server process started as the engine actor starts it: the key in a 0600 --config file."""
    folder = tmp_path_factory.mktemp("keyed")
    config = write_server_config(folder, KEY)
    port = free_port()
    command = [sys.executable, "-m", "runtime.rollout.sglang.server", "--model-path", str(tiny_model)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    log_path = folder / "server.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    address = f"127.0.0.1:{port}"
    try:

        async def ready() -> None:
            async with SGLangClient(address, api_key=KEY) as c:
                await c.wait_until_ready(timeout_s=90)

        asyncio.run(ready())
        yield address, process.pid
    except Exception:
        print(log_path.read_text())
        raise
    finally:
        process.terminate()
        process.wait(timeout=20)
        assert KEY not in log_path.read_text()


def test_client_and_adapter_send_the_key(keyed_server: tuple[str, int], tiny_model: Path) -> None:
    address, pid = keyed_server
    assert KEY not in " ".join(psutil.Process(pid).cmdline())
    assert KEY not in (Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"))

    async def refused(key: str | None) -> SGLangEngineError:
        async with SGLangClient(address, api_key=key) as c:
            with pytest.raises(SGLangEngineError) as err:
                await c.wait_until_ready(timeout_s=5)
            return err.value

    for key in (None, engine_secret()):
        began = time.monotonic()
        error = asyncio.run(refused(key))
        assert error.status == 401 and "refused the API key" in str(error)
        assert time.monotonic() - began < 5  # at once, not after the timeout

    engine = HttpRolloutEngine(address, api_key=KEY)
    try:
        [result] = engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_new_tokens=4))
        assert result.token_ids
        weights = {"model.norm.weight": torch.ones(64)}
        assert engine.load_weights(weights, 3) == 3
        assert engine.server_info()["weight_version"] == "3"
    finally:
        engine.shutdown()
