"""The fastgen backend of the SGLang-protocol server (runtime/rollout/sglang/fastgen_serving.py) on CPU with
the tiny model: the same greedy tokens and log-probs as the HF backend, continuous batching (a request
arriving mid-generation finishes while the earlier one still runs), aborts keeping partial output, weight
updates waiting for running requests and refusing older versions, and how the backend is chosen."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from runtime.devices import Device
from runtime.rollout.backend import BACKEND_ENV, RolloutBackend, backend_from_env, resolve_backend
from runtime.rollout.sglang.fastgen_serving import FastGenServing
from runtime.rollout.sglang.protocol import Finish, FinishType, GenerationRequest, normalize_generate
from runtime.rollout.sglang.server import ServerArgs, build_serving, create_app, parse_args
from runtime.rollout.sglang.serving import ServingEngine
from runtime.rollout.sglang.tensor_payload import read_hf_weights

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [40, 41, 42, 43]]


def requests(body: dict) -> list[GenerationRequest]:
    return normalize_generate(body, None).requests


@pytest.fixture
def fastgen(tiny_model: Path) -> Iterator[FastGenServing]:
    serving = build_serving(ServerArgs(model_path=str(tiny_model), relax_engine="fastgen"))
    assert isinstance(serving, FastGenServing)
    serving.start()
    yield serving
    serving.close()


def run(client: TestClient, body: dict) -> list[dict]:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    return data if isinstance(data, list) else [data]


def test_greedy_tokens_and_logprobs_equal_the_hf_backend(tiny_model: Path) -> None:
    """A mixed batch (per-request budgets, stop ids, ignore_eos, n > 1, a greedy temperature other than 1)
    gives the same tokens, finish reasons and texts on both backends, log-probs within fp32 tolerance."""
    frequent = None
    outputs = {}
    for backend in ("hf", "fastgen"):
        args = ServerArgs(model_path=str(tiny_model), relax_engine=backend)
        with TestClient(create_app(build_serving(args), args)) as client:
            if frequent is None:
                frequent = run(client, {"input_ids": PROMPTS[1], "sampling_params": {"temperature": 0}})[0][
                    "output_ids"
                ][0]
            sampling = [
                {"max_new_tokens": 12, "temperature": 0},
                {"max_new_tokens": 7, "temperature": 0, "stop_token_ids": [frequent]},
                {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True},
                {"max_new_tokens": 10, "temperature": 0.5, "top_k": 1},  # greedy, log-probs at T = 0.5
            ]
            outputs[backend] = [
                run(
                    client,
                    {"input_ids": PROMPTS, "sampling_params": sampling, "return_logprob": True},
                ),
                run(
                    client,
                    {
                        "input_ids": PROMPTS[1],
                        "sampling_params": {"n": 3, "max_new_tokens": 6, "temperature": 0},
                        "return_logprob": True,
                    },
                ),
            ]
    for hf_call, fg_call in zip(outputs["hf"], outputs["fastgen"], strict=True):
        for want, got in zip(hf_call, fg_call, strict=True):
            assert got["output_ids"] == want["output_ids"]
            assert got["text"] == want["text"]
            assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
            got_lp = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
            want_lp = [e[0] for e in want["meta_info"]["output_token_logprobs"]]
            assert got_lp == pytest.approx(want_lp, abs=1e-4)
    assert outputs["fastgen"][0][1]["meta_info"]["finish_reason"]["type"] == "stop"  # the stop id is reached


def test_a_request_arriving_mid_generation_joins_at_the_next_step(fastgen: FastGenServing) -> None:
    [long_request] = requests(
        {
            "input_ids": PROMPTS[0],
            "rid": "long",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        }
    )
    [alone_request] = requests(
        {"input_ids": PROMPTS[1], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    alone = fastgen.submit([alone_request])[0].result(timeout=60)  # the short request by itself

    [long_future] = fastgen.submit([long_request])
    deadline = time.monotonic() + 30
    while fastgen.engine.stats.decode_steps < 20 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert fastgen.load()["running"] == 1 and not long_future.done()
    [short_request] = requests(
        {"input_ids": PROMPTS[1], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    short = fastgen.submit([short_request])[0].result(timeout=60)
    assert not long_future.done()  # the short one did not wait for the long one's end...
    assert short.output_ids == alone.output_ids  # ... and joining a running batch changed none of its tokens
    assert short.output_logprobs == pytest.approx(alone.output_logprobs, abs=1e-5)

    assert fastgen.abort("long") == 1
    partial = long_future.result(timeout=60)
    assert partial.finish == Finish.abort("Aborted by /abort_request")
    assert 0 < len(partial.output_ids) == len(partial.output_logprobs) < 3000  # partial output kept


def test_abort_by_logical_rid_and_all(fastgen: FastGenServing) -> None:
    sampled = requests(
        {
            "input_ids": PROMPTS[2],
            "rid": "grp",
            "sampling_params": {"n": 3, "max_new_tokens": 3000, "ignore_eos": True},
        }
    )
    others = requests(
        {
            "input_ids": PROMPTS[:2],
            "rid": "other",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        }
    )
    group = fastgen.submit(sampled)
    rest = fastgen.submit(others)
    deadline = time.monotonic() + 30
    while fastgen.load()["running"] < 5 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert fastgen.abort("grp") == 3  # n > 1 children by the rid the caller gave
    for future in group:
        out = future.result(timeout=60)
        assert out.finish.type is FinishType.ABORT and len(out.output_ids) == len(out.output_logprobs) < 3000
    assert not any(f.done() for f in rest)
    assert fastgen.abort(abort_all=True) == 2
    assert {f.result(timeout=60).finish.type for f in rest} == {FinishType.ABORT}
    assert fastgen.load() == {"waiting": 0, "running": 0} and fastgen.flush_cache()


def test_weight_update_waits_for_running_requests(fastgen: FastGenServing, tiny_model: Path) -> None:
    """No output mixes two weight versions: the update runs once the running request has ended, and an
    older version is refused without loading anything."""
    [running] = requests(
        {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    )
    [future] = fastgen.submit([running])
    while fastgen.engine.stats.decode_steps < 5:
        time.sleep(0.002)
    weights = read_hf_weights(tiny_model)
    updater = threading.Thread(
        target=fastgen.update_weights_from_tensors, args=(weights,), kwargs={"weight_version": "1"}
    )
    updater.start()
    out = future.result(timeout=120)
    updater.join(timeout=60)
    assert len(out.output_ids) == 400 and out.weight_version == "default"
    assert fastgen.weight_version == "1" and fastgen.stats["weight_updates"] == 1
    with pytest.raises(ValueError, match="older than this engine's '1'"):
        fastgen.update_weights_from_disk(str(tiny_model), weight_version="0")
    assert fastgen.engine.weight_version == 1  # nothing was loaded
    fastgen.update_weights_from_disk(str(tiny_model), weight_version="2")
    assert fastgen.weight_version == "2" and fastgen.engine.weight_version == 2


def test_a_tensor_update_naming_an_unknown_tensor_or_a_wrong_shape_is_refused(
    fastgen: FastGenServing,
) -> None:
    norm = fastgen.engine.weights.hf["model.norm.weight"].shape
    for bad, message in [
        ({"bogus.weight": torch.zeros(norm)}, "unknown weight names: \\['bogus.weight'\\]"),
        ({"model.norm.weight": torch.zeros(3)}, re.escape(f"model.norm.weight: shape (3,) != {norm}")),
    ]:
        with pytest.raises(ValueError, match=message):
            fastgen.update_weights_from_tensors(bad, weight_version="9")
    assert fastgen.weight_version == "default" and fastgen.engine.weight_version == 0


def test_a_partial_disk_checkpoint_is_refused(
    fastgen: FastGenServing, tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    weights = read_hf_weights(tiny_model)
    weights.pop("model.norm.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        fastgen.update_weights_from_disk(str(tmp_path))
    assert fastgen.weight_version == "default" and fastgen.engine.weight_version == 0


def test_min_p_is_refused(fastgen: FastGenServing) -> None:
    with pytest.raises(ValueError, match="min_p"):
        fastgen.submit(requests({"input_ids": [1], "sampling_params": {"min_p": 0.1}}))


def test_backend_choice(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert backend_from_env() is RolloutBackend.AUTO
    monkeypatch.setenv(BACKEND_ENV, "FastGen")
    assert backend_from_env() is RolloutBackend.FASTGEN
    assert backend_from_env("hf") is RolloutBackend.HF  # the server's --relax-engine wins
    monkeypatch.setenv(BACKEND_ENV, "vllm")
    with pytest.raises(ValueError, match=BACKEND_ENV):
        backend_from_env()

    auto = RolloutBackend.AUTO
    assert resolve_backend(auto, tiny_model, cuda=False) is RolloutBackend.HF  # CPU: HF is the reference
    assert resolve_backend(auto, tiny_model, cuda=True) is RolloutBackend.FASTGEN
    assert resolve_backend(RolloutBackend.FASTGEN, tiny_model, cuda=False) is RolloutBackend.FASTGEN
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 8}))
    assert resolve_backend(auto, other, cuda=True) is RolloutBackend.HF  # an architecture fastgen lacks
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        resolve_backend(RolloutBackend.FASTGEN, other, cuda=True)

    monkeypatch.setenv(BACKEND_ENV, "fastgen")
    assert parse_args(["--model-path", str(tiny_model)]).relax_engine is None  # env read at build time
    assert isinstance(
        build_serving(ServerArgs(model_path=str(tiny_model)), device=Device.detect()), FastGenServing
    )
    args = parse_args(["--model-path", str(tiny_model), "--relax-engine", "hf"])
    assert isinstance(build_serving(args), ServingEngine)


def test_reserved_slots_are_capped_by_the_cache_budget(tiny_model: Path) -> None:
    """The server reserves a slot for every request it may run, but only as many as `max_cache_bytes`
    holds (on CUDA: half the free memory); the slots the waiting requests need are always allocated."""
    from runtime.rollout.fastgen import FastGenEngine
    from runtime.rollout.params import SamplingParams

    engine = FastGenEngine(str(tiny_model), device=Device.detect(), max_batch_size=16, window_quantum=16)
    engine.min_slots = 16
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    engine.generate([PROMPTS[0]], params)
    assert engine.slots == 16  # no cap: every reserved slot
    capped = FastGenEngine(str(tiny_model), device=Device.detect(), max_batch_size=16, window_quantum=16)
    capped.min_slots = 16
    capped.max_cache_bytes = int(capped._slot_bytes(16) * 5.5)
    alone = capped.generate([PROMPTS[0]], params)
    assert capped.slots == 4  # the largest batch bucket within 5.5 slots' bytes
    assert capped.generate(PROMPTS * 2, params)[0].token_ids == alone[0].token_ids
    assert capped.slots == 8  # eight waiting requests get their eight slots whatever the budget
