"""`--rollout-external --rollout-external-engine-addrs`: a GRPO job on a real local Ray drives an SGLang-protocol
server that the test started itself (`python -m runtime.rollout.sglang.server`, a separate process), pushes
every weight update to it, and leaves it running when the job ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime import driver
from runtime.rollout.sglang.engine_actor import REPO_ROOT, free_port
from tests.ray.conftest import read_metrics
from tests.ray.test_driver_grpo import grpo_spec

pytestmark = pytest.mark.ray

STEPS = 3


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def external_server(artifacts: dict[str, Path], tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """The built-in engine's server as an operator would start it, serving the *untrained* tiny model: the
    job's first weight push (its SFT-warmed `hf-checkpoint`) must replace those weights for the log-probs
    to agree."""
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "runtime.rollout.sglang.server", "--model-path", str(artifacts["model"])]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"server exited with {process.returncode}:\n{log_path.read_text()}"
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"server not healthy after 120 s:\n{log_path.read_text()}"
            time.sleep(0.2)
        yield process, url
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.mark.parametrize("colocate", [False, True], ids=["separate", "colocated"])
def test_grpo_drives_a_separately_started_server(
    ray_local,
    artifacts: dict[str, Path],
    external_server: tuple[subprocess.Popen, str],
    tmp_path: Path,
    colocate: bool,
) -> None:
    """Colocated, trainer and server take turns: the server's weights are released while the trainer
    computes log-probs and trains, and resumed before the weight push and the next rollout."""
    process, url = external_server
    address = url.removeprefix("http://")
    assert httpx.get(f"{url}/get_model_info").json()["weight_version"] == "default"

    spec = grpo_spec(
        artifacts,
        tmp_path,
        **{
            "colocate": colocate,
            "resource": {"actor": [1, 1]},
            "rollout-external": True,
            "rollout-external-engine-addrs": [address],
            "num-rollout": STEPS,
            "save-interval": None,
            "eval-interval": None,
            "eval-prompt-data": None,
        },
    )
    spec = {k: v for k, v in spec.items() if v is not None}
    spec_file = tmp_path / "grpo-external.json"
    spec_file.write_text(json.dumps({"name": "grpo-external", "spec": spec}))
    assert driver.main(["--spec-file", str(spec_file)]) == 0

    # every step generated on the server with the trainer's current weights: the initial push replaced the
    # untrained model the server was started with, and each step's sync reached it
    metrics = read_metrics(tmp_path / "report")
    diffs = [metrics["rollout/logprob_abs_diff"][s] for s in range(STEPS)]
    assert max(diffs) < 1e-5, diffs
    assert [metrics["rollout/weight_version"][s] for s in range(STEPS)] == list(range(STEPS))
    assert all(metrics["rollout/response_len"][s] > 0 for s in range(STEPS))
    assert metrics["train/grad_norm"][STEPS - 1] > 0

    # the server outlived the job (it is this test's child, not the driver's) and still serves
    assert process.poll() is None and pid_alive(process.pid)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    info = httpx.get(f"{url}/get_server_info", timeout=5).json()
    assert info["weight_version"] == str(STEPS)  # initial push 0, then one sync after each of the steps
    assert info["memory_occupation"]["weights"] == "resident"  # a colocated job ends with a push: resumed
    # released once per step (before log-probs) when colocated, never otherwise
    assert info["internal_states"][0]["memory_releases"] == (STEPS if colocate else 0)
    assert httpx.get(f"{url}/get_model_info", timeout=5).json()["weight_version"] == str(STEPS)

    # and it holds the trained weights: its log-probs equal a recomputation with the job's final HF export
    prompt = [5, 6, 7, 8]
    out = httpx.post(
        f"{url}/generate",
        json={
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=60,
    ).json()
    tokens = out["output_ids"]
    served = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = final(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    assert torch.allclose(served, want, atol=1e-5), (served, want)
    initial = AutoModelForCausalLM.from_pretrained(artifacts["model"], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = initial(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    stale = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    assert not torch.allclose(served, stale, atol=1e-3)  # not the weights it was started with

    # the test, which started the server, ends it
    process.terminate()
    process.wait(timeout=10)
    assert not pid_alive(process.pid)
