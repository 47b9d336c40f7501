"""The SGLang-protocol app over the tiny model, in-process: generation semantics checked against the
in-process engine of the same backend and a forward-pass recomputation, weight updates, memory release,
aborts, error shapes. Every protocol test runs over both serving backends (`hf`: `ServingEngine` over HF
`generate`; `fastgen`: `FastGenServing`); fastgen's own (continuous batching, equality with the hf
backend) are in test_fastgen_serving.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM

from runtime.devices import Device
from runtime.rollout.engine import FinishReason, SamplingParams, TorchRolloutEngine
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.sglang.protocol import Finish, FinishType, normalize_generate
from runtime.rollout.sglang.server import ServerArgs, Serving, build_serving, create_app
from runtime.rollout.sglang.serving import ServingEngine
from runtime.rollout.sglang.tensor_payload import RELAX_SAFETENSORS_FORMAT, encode_named_tensors

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]


# the forward-pass recomputation's tolerance: fastgen's decoder is its own fp32 code, not HF's
LOGPROB_ATOL = {"hf": 1e-5, "fastgen": 1e-4}


@pytest.fixture(scope="module", params=["hf", "fastgen"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def serving(tiny_model: Path, backend: str) -> Serving:
    return build_serving(ServerArgs(model_path=str(tiny_model), relax_engine=backend))


@pytest.fixture
def hf_serving(tiny_model: Path) -> ServingEngine:
    serving = build_serving(ServerArgs(model_path=str(tiny_model), relax_engine="hf"))
    assert isinstance(serving, ServingEngine)
    return serving


@pytest.fixture
def client(serving: Serving, tiny_model: Path) -> Iterator[TestClient]:
    with TestClient(create_app(serving, ServerArgs(model_path=str(tiny_model)))) as c:
        yield c


@pytest.fixture(scope="module")
def engine(tiny_model: Path, backend: str) -> TorchRolloutEngine | FastGenEngine:
    """The backend's engine in-process: the reference the server must reproduce (fastgen's request i of
    a call with seed s draws from mix_seed(s, i), in-process and served alike)."""
    if backend == "fastgen":
        return FastGenEngine(str(tiny_model), device=Device.detect())
    return TorchRolloutEngine(str(tiny_model), device=Device.detect())


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def recompute(
    model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    """log p(response token | everything before it) at `temperature`, from one unpadded forward."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def generate(client: TestClient, body: dict) -> list[dict]:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    return data if isinstance(data, list) else [data]


def lp(entries: list[list]) -> list[float]:
    return [e[0] for e in entries]


def test_seeded_batch_reproduces_the_in_process_engine(
    client: TestClient, engine: TorchRolloutEngine | FastGenEngine
) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    budgets = [12, 4, 9]
    expected = engine.generate(PROMPTS, params, budgets)
    outputs = generate(
        client,
        {
            "input_ids": PROMPTS,
            "sampling_params": [{"max_new_tokens": b, "sampling_seed": 7} for b in budgets],
            "return_logprob": True,
        },
    )
    for out, ref in zip(outputs, expected, strict=True):
        assert out["output_ids"] == ref.token_ids
        assert lp(out["meta_info"]["output_token_logprobs"]) == pytest.approx(ref.log_probs, abs=1e-6)
        assert out["meta_info"]["finish_reason"]["type"] == str(ref.finish_reason)


def test_logprobs_equal_recomputation(client: TestClient, reference: torch.nn.Module, backend: str) -> None:
    for temperature in (0.7, 0.0):
        body = {
            "input_ids": PROMPTS,
            "sampling_params": {"max_new_tokens": 10, "temperature": temperature, "sampling_seed": 1},
            "return_logprob": True,
        }
        for prompt, out in zip(PROMPTS, generate(client, body), strict=True):
            got = torch.tensor(lp(out["meta_info"]["output_token_logprobs"]))
            want = recompute(reference, prompt, out["output_ids"], temperature or 1.0)  # greedy reports T = 1
            assert torch.allclose(got, want, atol=LOGPROB_ATOL[backend]), (got - want).abs().max()


def test_stop_strings_agree_with_the_in_process_engine(
    client: TestClient, engine: TorchRolloutEngine | FastGenEngine
) -> None:
    free = engine.generate([PROMPTS[0]], SamplingParams(temperature=1.0, max_new_tokens=40, seed=3))[0]
    text = engine.tokenizer.decode(free.token_ids)
    stop = next(c for c in text[1:] if c.isascii() and c.isalnum())  # a character that first shows up later
    ref = engine.generate(
        [PROMPTS[0]], SamplingParams(temperature=1.0, max_new_tokens=40, seed=3, stop=(stop,))
    )[0]
    [out] = generate(
        client,
        {
            "input_ids": PROMPTS[0],
            "sampling_params": {"max_new_tokens": 40, "sampling_seed": 3, "stop": [stop]},
        },
    )
    assert ref.finish_reason is FinishReason.STOP
    assert out["output_ids"] == ref.token_ids  # the stop string's tokens stay in output_ids
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]  # ... and are trimmed from text, as SGLang does
    [kept] = generate(
        client,
        {
            "input_ids": PROMPTS[0],
            "sampling_params": {"max_new_tokens": 40, "sampling_seed": 3, "stop": stop, "no_stop_trim": True},
        },
    )
    assert kept["text"] == text[: text.index(stop) + 1]


def test_stop_tokens_min_new_tokens_and_ignore_eos(
    client: TestClient, reference: torch.nn.Module, backend: str
) -> None:
    [greedy] = generate(
        client, {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    )
    frequent = greedy["output_ids"][0]  # the token greedy decoding emits first
    body = {"input_ids": PROMPTS[0], "return_logprob": True}
    [stopped] = generate(
        client,
        {**body, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [frequent]}},
    )
    assert stopped["output_ids"] == [frequent]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": frequent}
    assert stopped["text"] == ""  # the matched stop token is cut from the text

    sampling = {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [frequent], "min_new_tokens": 3}
    [late] = generate(client, {**body, "sampling_params": sampling})
    assert frequent not in late["output_ids"][:3]
    # log-probs of the first 3 tokens come from the masked distribution SGLang samples from
    with torch.no_grad():
        logits = (
            reference(torch.tensor([PROMPTS[0] + late["output_ids"]]))
            .logits[0, len(PROMPTS[0]) - 1 :]
            .float()
        )
    logits[:3, [frequent, 0, 2]] = float("-inf")  # the stop token and the tiny model's two EOS ids
    masked = (
        torch.log_softmax(logits[:3], -1)
        .gather(-1, torch.tensor(late["output_ids"][:3])[:, None])
        .squeeze(-1)
    )
    got = lp(late["meta_info"]["output_token_logprobs"])[:3]
    assert got == pytest.approx(masked.tolist(), abs=LOGPROB_ATOL[backend])

    [ignored] = generate(
        client, {**body, "sampling_params": {**sampling, "min_new_tokens": 0, "ignore_eos": True}}
    )
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert ignored["output_ids"][0] == frequent and len(ignored["output_ids"]) == 8


def test_n_samples_prompt_major(client: TestClient) -> None:
    outputs = generate(
        client,
        {"input_ids": PROMPTS[:2], "rid": ["a", "b"], "sampling_params": {"n": 3, "max_new_tokens": 6}},
    )
    assert [o["meta_info"]["id"].split("_")[0] for o in outputs] == ["a"] * 3 + ["b"] * 3
    assert [o["meta_info"]["prompt_tokens"] for o in outputs] == [3] * 3 + [5] * 3
    assert len({tuple(o["output_ids"]) for o in outputs}) > 1  # independent samples


def test_prompt_logprobs_and_top_logprobs(
    client: TestClient, reference: torch.nn.Module, backend: str
) -> None:
    prompt = PROMPTS[1]
    [out] = generate(
        client,
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 1,
            "top_logprobs_num": 3,
        },
    )
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == prompt[1:] and entries[0][0] is None  # SGLang: the first is None
    want = recompute(reference, prompt[:2], prompt[2:], 1.0)
    assert lp(entries[1:]) == pytest.approx(want.tolist(), abs=LOGPROB_ATOL[backend])
    assert meta["input_top_logprobs"][0] is None and all(
        len(row) == 3 for row in meta["input_top_logprobs"][1:]
    )

    [sampled] = generate(
        client,
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 4},
            "return_logprob": True,
            "top_logprobs_num": 2,
        },
    )
    for chosen, top in zip(
        sampled["meta_info"]["output_token_logprobs"],
        sampled["meta_info"]["output_top_logprobs"],
        strict=True,
    ):
        assert len(top) == 2 and top[0][0] >= top[1][0] and chosen[0] <= top[0][0] + 1e-6


def test_partial_tensor_update_changes_outputs_and_version(client: TestClient, serving: Serving) -> None:
    body = {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    [before] = generate(client, body)
    norm = serving.named_weight("model.norm.weight")
    payload = encode_named_tensors({"model.norm.weight": -3.0 * norm})
    response = client.post(
        "/update_weights_from_tensor",
        json={
            "serialized_named_tensors": [payload],
            "load_format": RELAX_SAFETENSORS_FORMAT,
            "weight_version": "5",
        },
    )
    assert response.json() == {"success": True, "message": "Success"}
    [after] = generate(client, body)
    assert after["output_ids"] != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "5"
    assert client.get("/get_model_info").json()["weight_version"] == "5"

    # an older version is refused loudly, before anything is loaded; the same one again is accepted
    def push(version: str) -> Any:
        return client.post(
            "/update_weights_from_tensor",
            json={
                "serialized_named_tensors": [encode_named_tensors({"model.norm.weight": norm})],
                "load_format": RELAX_SAFETENSORS_FORMAT,
                "weight_version": version,
            },
        )

    stale = push("4")
    assert stale.status_code == 400 and "older than this engine's '5'" in stale.json()["message"]
    assert torch.equal(serving.named_weight("model.norm.weight"), -3.0 * norm)
    assert generate(client, body)[0]["output_ids"] == after["output_ids"]
    assert push("5").json()["success"] and torch.equal(serving.named_weight("model.norm.weight"), norm)

    for bad, message in [
        ({"bogus.weight": norm}, "unknown weight names"),
        ({"model.norm.weight": torch.zeros(3)}, "shape"),
    ]:
        response = client.post(
            "/update_weights_from_tensor",
            json={
                "serialized_named_tensors": [encode_named_tensors(bad)],
                "load_format": RELAX_SAFETENSORS_FORMAT,
            },
        )
        assert response.status_code == 400 and message in response.json()["message"]
    sglang_format = client.post("/update_weights_from_tensor", json={"serialized_named_tensors": [payload]})
    assert (
        sglang_format.status_code == 400
        and "load_format=None is not accepted" in sglang_format.json()["message"]
    )


def test_release_and_resume_memory(client: TestClient) -> None:
    body = {
        "input_ids": PROMPTS[0],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        "return_logprob": True,
    }
    [before] = generate(client, body)
    resident = client.get("/get_server_info").json()["memory_occupation"]
    assert resident["weights"] == "resident" and resident["weight_bytes_offloaded"] == 0

    assert client.post("/release_memory_occupation", json={}).json() is None
    released = client.get("/get_server_info").json()["memory_occupation"]
    assert released["weights"] == "released" and released["kv_cache"] == "released"
    assert released["weight_bytes_resident"] == 0
    assert released["weight_bytes_offloaded"] == resident["weight_bytes_resident"]
    refused = client.post("/generate", json=body)
    assert refused.status_code == 503 and "resume_memory_occupation" in refused.json()["error"]["message"]
    assert client.get("/health_generate").status_code == 200  # released on purpose is not unhealthy

    assert client.post("/resume_memory_occupation", json={"tags": ["weights"]}).status_code == 200
    assert client.post("/generate", json=body).status_code == 503  # the KV cache is still released
    assert client.post("/resume_memory_occupation", json={"tags": ["kv_cache"]}).status_code == 200
    [after] = generate(client, body)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    assert client.get("/get_server_info").json()["memory_occupation"] == resident
    bad = client.post("/release_memory_occupation", json={"tags": ["activations"]})
    assert bad.status_code == 400 and "unknown memory tags" in bad.json()["error"]["message"]


def test_abort_running_and_queued_requests(hf_serving: ServingEngine) -> None:
    """HF backend: a request of another batch key waits for the running batch (fastgen's continuous
    batching runs it at once: test_fastgen_serving.py)."""
    serving = hf_serving
    serving.start()
    try:
        long = normalize_generate(
            {
                "input_ids": [[5, 6, 7]] * 64,
                "rid": "long",
                "sampling_params": {"max_new_tokens": 240, "ignore_eos": True},
            },
            None,
        ).requests
        queued = normalize_generate(
            {
                "input_ids": [1, 2],
                "rid": "queued",
                "sampling_params": {"max_new_tokens": 5, "temperature": 0.5},
            },
            None,
        ).requests
        futures = serving.submit(long)
        deadline = time.monotonic() + 10
        while serving.load()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        queued_future = serving.submit(queued)[0]  # a different batch key: waits behind the running batch
        assert serving.abort(abort_all=True) == 65
        outputs = [f.result(timeout=30) for f in futures]
        assert {o.finish.type for o in outputs} == {FinishType.ABORT}
        assert all(len(o.output_ids) == len(o.output_logprobs) < 240 for o in outputs)  # partial output kept
        skipped = queued_future.result(timeout=30)
        assert skipped.finish == Finish.abort("Aborted by /abort_request") and skipped.output_ids == []
        assert serving.flush_cache()
    finally:
        serving.close()


def test_flush_cache_is_refused_while_busy(hf_serving: ServingEngine) -> None:
    serving = hf_serving
    gate = threading.Event()
    serving._lock.acquire()  # hold the engine (as a weight load would) so the request stays running
    serving.start()
    try:
        future = serving.submit(
            normalize_generate({"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}, None).requests
        )[0]
        while serving.load()["running"] == 0:
            gate.wait(0.005)
        assert not serving.flush_cache()
    finally:
        serving._lock.release()
    future.result(timeout=30)
    assert serving.flush_cache()
    serving.close()


def test_errors_in_sglang_shapes(client: TestClient, serving: Serving) -> None:
    bad = client.post("/generate", json={"input_ids": [1], "sampling_params": {"top_p": 0}})
    assert bad.status_code == 400 and bad.json() == {
        "error": {"message": "top_p must be in (0, 1], got 0.0."}
    }
    assert client.post("/generate", content=b"not json").status_code == 400
    missing = client.post("/update_weights_from_disk", json={})
    assert missing.status_code == 400 and "model_path" in missing.json()["message"]
    disk = client.post("/update_weights_from_disk", json={"model_path": "/no/such/model"})
    assert disk.status_code == 400 and disk.json()["success"] is False
    assert client.post("/abort_request", json={"rid": "nothing-running"}).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/health_generate").status_code == 200
    info = client.get("/get_model_info").json()
    assert info["is_generation"] and info["model_type"] == "qwen2" and info["weight_version"] == "default"
    assert client.post("/update_weight_version", json={"new_version": "9"}).json()["new_version"] == "9"
    assert client.get("/model_info").json()["weight_version"] == "9"
    assert client.get("/get_server_info").json()["engine"] == serving.engine_name


def test_skip_tokenizer_init(tiny_model: Path, backend: str) -> None:
    args = ServerArgs(model_path=str(tiny_model), skip_tokenizer_init=True, relax_engine=backend)
    with TestClient(create_app(build_serving(args), args)) as client:
        [out] = generate(client, {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 3}})
        assert "text" not in out and len(out["output_ids"]) <= 3
        refused = client.post("/generate", json={"text": "1+1="})
        assert refused.status_code == 400 and "skip-tokenizer-init" in refused.json()["error"]["message"]
