"""Our SGLang-protocol server taking weights through SGLang's own distributed calls
(`/init_weights_update_group`, `/update_weights_from_distributed`, `/destroy_weights_update_group`), as a
separate process over gloo. This test process is the trainer's rank 0 (`WeightSender`, the runtime's own
sender) and drives the server through `HttpRolloutEngine`, the actor the rollout role runs; a raw request in
SGLang's per-tensor payload shows the format other SGLang callers send."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.models.tiny import build_tiny_model
from runtime.rollout.params import SamplingParams
from runtime.rollout.sglang.engine_actor import REPO_ROOT, HttpRolloutEngine, free_port
from runtime.rollout.sglang.weight_group import (
    FLATTENED,
    JoinOrder,
    PushOrder,
    TensorMeta,
    WeightGroup,
    describe,
)
from runtime.weight_sync.collective import WeightSender

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def trainer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-seed1") / "model", seed=1)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpRolloutEngine]:
    """A fastgen server on the seed-0 model, driven by the HTTP engine actor's class (no Ray)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    command = [sys.executable, "-m", "runtime.rollout.sglang.server", "--model-path", str(tiny_model)]
    command += ["--port", str(port), "--relax-engine", "fastgen", "--max-running-requests", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    try:
        adapter = HttpRolloutEngine(f"127.0.0.1:{port}", engine_index=3, ready_timeout_s=90)
        yield adapter
        adapter.shutdown()
    except Exception:
        print(log_path.read_text())
        raise
    finally:
        process.terminate()
        process.wait(timeout=20)


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run `fn` beside the caller (the engine's side of a collective); the returned call joins it and
    answers its result or raises its error."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the engine's side hung"
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def greedy_log_probs(engine: HttpRolloutEngine) -> tuple[list[list[float]], list[list[int]]]:
    results = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=4))
    return [r.log_probs for r in results], [r.token_ids for r in results]


def recompute(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_a_push_through_sglangs_distributed_calls(engine: HttpRolloutEngine, trainer_model: Path) -> None:
    trainer = AutoModelForCausalLM.from_pretrained(trainer_model, dtype=torch.float32).eval()
    weights = {n: t for n, t in trainer.state_dict().items() if n != "lm_head.weight"}  # tied
    info = engine.weight_group_info()
    assert info == {"ranks": 1, "load_formats": [FLATTENED, None], "engine_index": 3}

    sender = WeightSender("relax-test-group", timeout_s=30.0, host="127.0.0.1")
    host, port, backend = sender.address
    assert backend == "gloo"
    joined = in_thread(
        lambda: engine.weight_group_join(
            JoinOrder(host, port, 1, 2, "relax-test-group", backend, timeout_s=30.0, member="engine3")
        )
    )
    sender.join(2)
    joined()

    plan = sender.prepare(1, weights, bucket_bytes=48 * 1024)
    assert len(plan) > 2
    order = PushOrder("relax-test-group", 1, tuple(map(tuple, plan)), 1, 0, FLATTENED, 30.0)
    received = in_thread(lambda: engine.weight_push_receive(order))
    sender.send(1, ["engine3"], 30.0, FLATTENED)
    assert received() == 1
    assert sender.error(1, 5.0) is None
    assert engine.server_info()["weight_version"] == "1"

    log_probs, responses = greedy_log_probs(engine)  # the trainer's weights now generate
    for prompt, response, got in zip(PROMPTS, responses, log_probs, strict=True):
        assert torch.allclose(torch.tensor(got), recompute(trainer, prompt, response), atol=1e-4)

    # a push whose version the engine does not hold is refused before a byte moves, for the trainer too
    stale = PushOrder("relax-test-group", 2, tuple(map(tuple, plan)), 5, 3, FLATTENED, 30.0)
    sender.prepare(2, weights, bucket_bytes=48 * 1024)
    sender.send(2, ["engine3"], 30.0, FLATTENED)
    with pytest.raises(
        Exception, match="engine3: weight push 2 \\(version 5.*holds version 1, the driver expected 3"
    ):
        engine.weight_push_receive(stale)
    assert "aborted: engine3: weight push 2" in (sender.error(2, 10.0) or "")
    engine.weight_group_leave()
    sender.close()


def test_sglangs_per_tensor_payload_and_a_missing_tensor(
    engine: HttpRolloutEngine, trainer_model: Path
) -> None:
    """What an SGLang caller sends: no gate, one broadcast per tensor (no load_format), the version on the
    last call. A push that leaves a tensor out is received in full (nobody hangs), then refused naming it."""
    trainer = AutoModelForCausalLM.from_pretrained(trainer_model, dtype=torch.float32).eval()
    weights = {n: t * 0.5 for n, t in trainer.state_dict().items() if n != "lm_head.weight"}
    store = WeightGroup.serve_store("127.0.0.1", 30.0)
    url = f"{engine.address}/init_weights_update_group"
    body = {"master_address": "127.0.0.1", "master_port": store.port, "rank_offset": 1, "world_size": 2}
    answer = in_thread(lambda: httpx.post(url, json={**body, "backend": "gloo"}, timeout=60))
    group = WeightGroup.join(
        master_address="127.0.0.1", master_port=store.port, rank=0, world_size=2, store=store, timeout_s=30.0
    )
    assert answer().json() == {"success": True, "message": "Succeeded to initialize custom process group."}

    def push(metas: list[TensorMeta], version: str) -> httpx.Response:
        request = {
            "names": [m.name for m in metas],
            "dtypes": [m.dtype for m in metas],
            "shapes": [list(m.shape) for m in metas],
            "group_name": "weight_update_group",
            "flush_cache": True,
            "weight_version": version,
        }
        reply = in_thread(
            lambda: httpx.post(f"{engine.address}/update_weights_from_distributed", json=request, timeout=60)
        )
        group.send(metas, [weights[m.name] for m in metas], device=torch.device("cpu"), load_format=None)
        return reply()

    metas = describe(weights.items())
    refused = push([m for m in metas if m.name != "model.norm.weight"], "7")
    assert refused.status_code == 400
    assert "missing ['model.norm.weight']" in refused.json()["message"]
    assert engine.server_info()["weight_version"] == "1"

    accepted = push(metas, "7")
    assert accepted.json() == {"success": True, "message": "Succeeded to update parameter online."}
    assert engine.server_info()["weight_version"] == "7"
    halved = AutoModelForCausalLM.from_pretrained(trainer_model, dtype=torch.float32).eval()
    halved.load_state_dict(weights, strict=False)
    log_probs, responses = greedy_log_probs(engine)
    for prompt, response, got in zip(PROMPTS, responses, log_probs, strict=True):
        assert torch.allclose(torch.tensor(got), recompute(halved, prompt, response), atol=1e-4)

    reply = httpx.post(f"{engine.address}/destroy_weights_update_group", json={}, timeout=30)
    assert reply.json()["success"] is True
    group.leave()
