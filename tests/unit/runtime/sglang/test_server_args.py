"""The built-in engine's server takes SGLang's server flags: it implements --context-length (with
--allow-auto-truncate) and --max-running-requests as SGLang does, and names every other SGLang flag in one
startup line; a flag that is not SGLang's is logged, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runtime.rollout.sglang.server import ServerArgs, build_serving, create_app, parse_args
from runtime.rollout.sglang.serving import ServingEngine

UNUSED_LINE = "SGLang server arguments the built-in engine does not use: "


@pytest.fixture  # a ServingEngine starts (and closes) with one app
def serving(tiny_model: Path) -> ServingEngine:
    return build_serving(ServerArgs(model_path=str(tiny_model), max_running_requests=2))


def _client(serving: ServingEngine, **args: object) -> TestClient:
    return TestClient(create_app(serving, ServerArgs(model_path=serving.model_path, **args)))  # type: ignore[arg-type]


@pytest.fixture
def limited(serving: ServingEngine) -> Iterator[TestClient]:
    with _client(serving, context_length=8, max_running_requests=2) as client:
        yield client


def test_unknown_sglang_flags_are_named_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtime.rollout.sglang.server")
    args = parse_args(
        ["--model-path", "m", "--mem-fraction-static", "0.7", "--enable-dp-attention", "--cuda-graph-bs", "1",
         "2", "4", "--max-running-requests", "16", "--context-length", "4096", "--random-seed", "3",
         "--quantization=fp8", "--not-an-sglang-flag", "x"]
    )  # fmt: skip
    assert (args.max_running_requests, args.context_length, args.random_seed) == (16, 4096, 3)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(UNUSED_LINE)]
    assert lines == [
        UNUSED_LINE
        + "--mem-fraction-static 0.7, --enable-dp-attention, --cuda-graph-bs 1 2 4, --quantization fp8"
    ]
    assert any(
        r.getMessage() == "arguments that are not SGLang server arguments, ignored: --not-an-sglang-flag x"
        for r in caplog.records
    )


def test_an_sglang_flag_is_not_read_as_a_prefix_of_ours(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtime.rollout.sglang.server")
    args = parse_args(["--model-path", "m", "--context-length", "64", "--tokenizer-mode", "slow"])
    assert args.tokenizer_path is None and args.context_length == 64
    assert any(r.getMessage() == UNUSED_LINE + "--tokenizer-mode slow" for r in caplog.records)


def test_max_running_requests_is_the_batch_size(serving: ServingEngine) -> None:
    assert serving.max_batch_size == 2 and serving.engine.max_batch_size == 2
    with _client(serving, max_running_requests=2) as client:
        assert client.get("/get_server_info").json()["max_batch_size"] == 2
        # more prompts than one batch takes are still all served
        out = client.post(
            "/generate", json={"input_ids": [[5, 6]] * 5, "sampling_params": {"max_new_tokens": 2}}
        )
        assert out.status_code == 200 and len(out.json()) == 5


def test_context_length_refuses_what_does_not_fit(limited: TestClient) -> None:
    long = limited.post("/generate", json={"input_ids": list(range(3, 11)), "sampling_params": {}})
    assert long.status_code == 400
    assert long.json()["error"]["message"] == (
        "The input (8 tokens) is longer than the model's context length (8 tokens)."
    )
    total = limited.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6}})
    assert total.status_code == 400
    assert (
        "maximum context length of 8 tokens. You requested a total of 9 tokens"
        in total.json()["error"]["message"]
    )
    fits = limited.post(
        "/generate",
        json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}},
    )
    assert fits.status_code == 200 and fits.json()["meta_info"]["completion_tokens"] == 5


def test_allow_auto_truncate_cuts_to_fit(serving: ServingEngine) -> None:
    with _client(serving, context_length=8, allow_auto_truncate=True) as client:
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
        out = client.post("/generate", json=body).json()
        assert out["meta_info"]["prompt_tokens"] == 3 and out["meta_info"]["completion_tokens"] == 5
        long = client.post("/generate", json={"input_ids": list(range(3, 15)), "sampling_params": {}}).json()
        assert long["meta_info"]["prompt_tokens"] == 8 and long["meta_info"]["completion_tokens"] == 0
