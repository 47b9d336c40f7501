"""The built-in engine's SGLang server started as its own process (`python -m runtime.rollout.sglang.server`)
and driven over HTTP by the runtime's client and by the `HttpRolloutEngine` adapter."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from runtime.models.tiny import build_tiny_model
from runtime.rollout.engine import FinishReason, SamplingParams
from runtime.rollout.sglang.client import RetryPolicy, SGLangClient, SGLangEngineError
from runtime.rollout.sglang.engine_actor import REPO_ROOT, HttpRolloutEngine, free_port
from runtime.rollout.sglang.tensor_payload import read_hf_weights
from runtime.types import SampleStatus

T = TypeVar("T")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-seed1") / "model", seed=1)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server process on a free port, started as an operator would (with SGLang flags it ignores)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    command = [sys.executable, "-m", "runtime.rollout.sglang.server", "--model-path", str(tiny_model)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--tp-size", "1", "--mem-fraction-static", "0.8"]
    command += ["--trust-remote-code", "--chunked-prefill-size", "512", "--enable-dp-attention"]
    command += ["--cuda-graph-bs", "1", "2", "4", "--max-running-requests", "16", "--random-seed", "3"]
    command += ["--not-an-sglang-flag", "x"]
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    address = f"127.0.0.1:{port}"
    began = time.monotonic()
    try:

        async def ready() -> None:
            async with SGLangClient(address) as client:
                await client.wait_until_ready(timeout_s=60)

        run(ready())
        print(f"server ready in {time.monotonic() - began:.1f} s")
        yield address, log_path
    except Exception:
        print(log_path.read_text())
        raise
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def recompute(
    model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_health_and_info(server: tuple[str, Path]) -> None:
    address, log_path = server

    async def check() -> None:
        async with SGLangClient(address) as client:
            assert await client.health() and await client.health_generate()
            model = await client.model_info()
            assert model["is_generation"] and model["weight_version"] == "default"
            info = await client.server_info()
            assert (
                info["engine"] == "relax-torch"
                and info["tp_size"] == 1
                and info["port"] == int(address.split(":")[1])
            )
            assert info["mem_fraction_static"] == 0.8
            assert info["max_batch_size"] == info["max_running_requests"] == 16 and info["random_seed"] == 3

    run(check())
    log = log_path.read_text()
    assert (
        "SGLang server arguments the built-in engine does not use: --mem-fraction-static 0.8, "
        "--trust-remote-code, --chunked-prefill-size 512, --enable-dp-attention, --cuda-graph-bs 1 2 4\n"
    ) in log
    assert "arguments that are not SGLang server arguments, ignored: --not-an-sglang-flag x" in log


def test_generate_with_logprobs_stop_strings_and_n(
    server: tuple[str, Path], reference: torch.nn.Module, tiny_model: Path
) -> None:
    address, _ = server
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)

    async def check() -> None:
        async with SGLangClient(address) as client:
            sampling = {
                "temperature": 0.8,
                "max_new_tokens": 24,
                "sampling_seed": 5,
                "skip_special_tokens": False,
            }
            outputs = await client.generate(PROMPTS, sampling)
            for prompt, out in zip(PROMPTS, outputs, strict=True):
                assert len(out.log_probs) == len(out.token_ids) > 0
                want = recompute(reference, prompt, out.token_ids, 0.8)
                assert torch.allclose(torch.tensor(out.log_probs), want, atol=1e-5)
                ids = out.token_ids[:-1] if out.status is SampleStatus.COMPLETED else out.token_ids
                assert out.text == tokenizer.decode(ids)
                assert out.prompt_tokens == len(prompt) and out.weight_version == "default"

            # stop strings: the same single-row request (same seed, same RNG stream) without, then with one
            [free] = await client.generate([PROMPTS[0]], sampling)
            text = free.text or ""
            stop = next(c for c in text[1:] if c.isascii() and c.isalnum())
            [stopped] = await client.generate([PROMPTS[0]], {**sampling, "stop": [stop]})
            assert stopped.finish.to_json() == {"type": "stop", "matched": stop}
            assert stopped.status is SampleStatus.COMPLETED and stopped.text == text[: text.index(stop)]
            assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]

            grouped = await client.generate(PROMPTS[:2], {"max_new_tokens": 8, "n": 4})
            assert [g.prompt_tokens for g in grouped] == [3] * 4 + [5] * 4
            assert all(len(g.log_probs) == len(g.token_ids) for g in grouped)

            from_text = await client.generate(["1+2="], {"max_new_tokens": 4, "temperature": 0})
            assert from_text[0].prompt_tokens == len(tokenizer("1+2=")["input_ids"])

    run(check())


def test_weight_updates_from_disk_and_tensor(
    server: tuple[str, Path], tiny_model: Path, other_model: Path
) -> None:
    address, _ = server
    # seeded samples, not greedy: greedy decoding of a random tiny model repeats the last prompt token
    # whatever its weights
    sampling = {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 3}

    async def check() -> None:
        async with SGLangClient(address) as client:
            before = await client.generate(PROMPTS, sampling)
            message = await client.update_weights_from_disk(str(other_model), weight_version="1")
            assert str(other_model) in message
            changed = await client.generate(PROMPTS, sampling)
            assert [o.log_probs for o in changed] != [o.log_probs for o in before]
            assert [o.token_ids for o in changed] != [o.token_ids for o in before]
            assert {o.weight_version for o in changed} == {"1"}
            assert (await client.model_info())["model_path"] == str(other_model)

            # back to the first model's weights, as a trainer pushes them: named tensors, in buckets
            await client.update_weights_from_tensor(
                read_hf_weights(tiny_model), weight_version="2", bucket_bytes=64 << 10
            )
            restored = await client.generate(PROMPTS, sampling)
            assert [o.token_ids for o in restored] == [o.token_ids for o in before]
            assert [o.log_probs for o in restored] == [o.log_probs for o in before]
            assert {o.weight_version for o in restored} == {"2"}

            with pytest.raises(
                SGLangEngineError, match=f"SGLang engine at http://{address}: POST /update_weights_from_disk"
            ):
                await client.update_weights_from_disk("/no/such/folder")

    run(check())


def test_release_resume_and_flush(server: tuple[str, Path]) -> None:
    address, _ = server

    async def check() -> None:
        async with SGLangClient(address) as client:
            await client.release_memory_occupation()
            memory = (await client.server_info())["memory_occupation"]
            assert memory["weights"] == "released" and memory["weight_bytes_resident"] == 0
            with pytest.raises(SGLangEngineError) as info:
                await client.generate(PROMPTS, {"max_new_tokens": 2})
            assert info.value.status == 503 and address in str(info.value)
            await client.resume_memory_occupation()
            assert (await client.server_info())["memory_occupation"]["weights"] == "resident"
            assert len(await client.generate(PROMPTS, {"max_new_tokens": 2})) == 3
            await client.flush_cache()
            assert (await client.server_info())["internal_states"][0]["cache_flushes"] >= 1

    run(check())


def test_abort_returns_partial_outputs(server: tuple[str, Path]) -> None:
    address, _ = server

    async def check() -> None:
        async with SGLangClient(address) as client:
            sampling = {"max_new_tokens": 240, "ignore_eos": True}
            task = asyncio.create_task(client.generate([[5, 6, 7]] * 64, sampling))
            for _ in range(500):
                if (await client.server_info())["internal_states"][0]["load"]["running"]:
                    break
                await asyncio.sleep(0.01)
            await client.abort_request(abort_all=True)
            outputs = await task
            assert {o.status for o in outputs} == {SampleStatus.ABORTED}
            assert all(len(o.token_ids) == len(o.log_probs) < 240 for o in outputs)

    run(check())


def test_http_rollout_engine_adapter(server: tuple[str, Path], tiny_model: Path) -> None:
    """The adapter the pipeline uses: RolloutEngineActor's methods over HTTP."""
    address, _ = server
    engine = HttpRolloutEngine(address, engine_index=0)
    try:
        assert engine.ready()["engine"] == "relax-torch"
        params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
        results = engine.generate(PROMPTS, params, budgets=[10, 3, 6])
        assert [len(r.token_ids) <= b for r, b in zip(results, [10, 3, 6], strict=True)] == [True] * 3
        assert all(r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) for r in results)
        assert engine.generate(PROMPTS, params, budgets=[10, 3, 6]) == results  # seeded: reproducible

        assert engine.load_weights(read_hf_weights(tiny_model), version=3) == 3
        assert {r.weight_version for r in engine.generate(PROMPTS, params)} == {3}
        engine.offload()
        assert engine.server_info()["memory_occupation"]["weights"] == "released"
        engine.onload()
        assert len(engine.generate(PROMPTS, params)) == 3
    finally:
        engine.shutdown()


def test_unreachable_engine_is_named_after_retries() -> None:
    port = free_port()  # nothing listens here

    async def check() -> None:
        async with SGLangClient(
            f"127.0.0.1:{port}", retry=RetryPolicy(attempts=3, initial_backoff_s=0.01)
        ) as client:
            assert not await client.health()
            with pytest.raises(SGLangEngineError) as info:
                await client.server_info()
            assert f"SGLang engine at http://127.0.0.1:{port}: GET /get_server_info failed" in str(info.value)
            assert "unreachable after 3 attempt(s)" in str(info.value)
            with pytest.raises(SGLangEngineError, match="not ready after 0 s"):
                await client.wait_until_ready(timeout_s=0.3)

    run(check())
