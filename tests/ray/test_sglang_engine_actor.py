"""SGLang-protocol rollout engines on a real local Ray: an engine actor that launches the built-in engine's
server as a child process serves `RolloutGroup` (generate, object-store weight sync, offload/onload), an
external-engine adapter drives the same server, and the server dies with its actor."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import psutil
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from runtime.models.tiny import build_tiny_model
from runtime.roles.groups import RolloutGroup
from runtime.rollout.engine import SamplingParams
from runtime.rollout.sglang.engine_actor import SGLangEngineActor, engine_secret, external_engine_actors
from runtime.rollout.sglang.tensor_payload import read_hf_weights

pytestmark = pytest.mark.ray

PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [12], [13, 14]]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_engine_actor_serves_the_rollout_group(ray_local: None, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    other = build_tiny_model(tmp_path / "tiny-1", seed=1)
    key = engine_secret()
    actor = (
        ray.remote(SGLangEngineActor)
        .options(num_cpus=1)
        .remote(str(model), engine_index=0, num_threads=1, api_key=key)
    )
    info = ray.get(actor.ready.remote(), timeout=120)
    assert (info["launcher"], info["engine"], info["dies_with_actor"]) == (
        "builtin",
        "relax-torch",
        "watch-pid",
    )
    # the server wants the key on every route; it is not on the server's command line
    assert httpx.get(f"{info['address']}/get_server_info").status_code == 401
    assert httpx.get(f"{info['address']}/health", headers={"Authorization": "Bearer x"}).status_code == 401
    assert key not in " ".join(psutil.Process(info["server_pid"]).cmdline())
    group = RolloutGroup([actor])
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)

    results = group.generate(PROMPTS, params)
    assert len(results) == len(PROMPTS)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for prompt, result in zip(PROMPTS, results, strict=True):
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(result.log_probs), want, atol=1e-5)

    # weight sync as ObjectStoreWeightSync does it: one object in the store, resolved inside the actor
    group.load_weights(ray.put(read_hf_weights(other)), version=1)
    synced = group.generate(PROMPTS, params)
    assert {r.weight_version for r in synced} == {1}
    assert [r.log_probs for r in synced] != [r.log_probs for r in results]
    group.offload()
    assert ray.get(actor.server_info.remote())["memory_occupation"]["weights"] == "released"
    group.onload()

    # --rollout-external-engine-addrs: a light adapter actor drives the already-running server
    address = ray.get(actor.get_address.remote())
    [external] = external_engine_actors([address.removeprefix("http://")], api_key=key)
    assert ray.get(external.ready.remote(), timeout=60)["address"] == address
    assert RolloutGroup([external]).generate(PROMPTS, params) == group.generate(PROMPTS, params)

    # the server is the actor's child: killing the actor (as Roles.shutdown does) ends it
    ray.kill(actor)
    deadline = time.monotonic() + 20
    while pid_alive(info["server_pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(info["server_pid"])
    ray.kill(external)
