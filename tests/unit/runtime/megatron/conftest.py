"""Fixtures for the megatron backend tests: tiny random Hugging Face models per family (offline), one
in-process megatron world of size 1 (gloo), and a launcher for multi-process runs of `dist_worker.py`."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]

# hidden 64, 4 heads of 16, 2 KV heads; each family exercises a different choice
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2", {"tie_word_embeddings": True}),  # q/k/v biases, tied embeddings
    "qwen3": ("Qwen3", {"head_dim": 32, "rope_theta": 1e6}),  # q/k norm, head_dim != hidden / heads
    "llama": ("Llama", {"rope_theta": 5e5}),
    "qwen3_moe": (
        "Qwen3Moe",
        {
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "router_aux_loss_coef": 0.0,
            "head_dim": 16,
        },
    ),
}


def hf_classes(family: str):
    import transformers

    prefix = FAMILIES[family][0]
    return getattr(transformers, f"{prefix}Config"), getattr(transformers, f"{prefix}ForCausalLM")


def make_hf_model(family: str, *, seed: int = 0, **overrides: Any):
    """A tiny random model of `family`; norm weights are perturbed too, so a swapped norm shows."""
    config_cls, model_cls = hf_classes(family)
    shape = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 200,
        "max_position_embeddings": 64,
    }
    config = config_cls(**{**shape, **FAMILIES[family][1], **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`hf_folder(family, **config_overrides)`: a saved tiny model (cached per arguments)."""
    cache: dict[str, Path] = {}

    def build(family: str, **overrides: Any) -> Path:
        key = json.dumps([family, overrides], sort_keys=True)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"hf-{family}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make_hf_model(family, **overrides).save_pretrained(folder)
            cache[key] = folder
        return cache[key]

    return build


@pytest.fixture(scope="module")
def megatron_world() -> Iterator[None]:
    """megatron-core's parallel state for one process (TP = PP = 1) over gloo, CPU shims on; per module, so
    the shims' torch function mode is off again for the rest of the test session."""
    from runtime.train.megatron.cpu import remove_cpu_shims
    from runtime.train.megatron.parallel import (
        ParallelLayout,
        destroy_parallel,
        free_port,
        init_process_group,
        initialize_parallel,
    )

    init_process_group(0, 1, "127.0.0.1", free_port(), timeout_minutes=2)
    initialize_parallel(ParallelLayout(), seed=1234)
    yield
    destroy_parallel()
    remove_cpu_shims()


def hf_reference_losses(
    folder: Path, tokens: torch.Tensor, *, steps: int, lr: float, clip: float
) -> list[float]:
    """Per-step mean token cross-entropy of the HF model trained with fp32 Adam (no weight decay)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).train()
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def run_ranks(tmp_path: Path) -> Callable[..., list[dict[str, Any]]]:
    """`run_ranks(world, job)`: run `dist_worker.run` on `world` local processes (gloo on a loopback port),
    forked from the session's warm server (tests/unit/runtime/ranks.py); returns each rank's JSON result."""

    def run(world: int, job: dict[str, Any], timeout: float = 120) -> list[dict[str, Any]]:
        from runtime.train.megatron.parallel import free_port
        from tests.unit.runtime import ranks
        from tests.unit.runtime.megatron import dist_worker

        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        job_path = tmp_path / "job.json"
        job_path.write_text(json.dumps({**job, "out": str(out)}))
        ranks.spawn(dist_worker.run, (world, free_port(), str(job_path)), nprocs=world, timeout=timeout)
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]

    return run


@pytest.fixture(scope="session")
def reference_losses() -> Callable[..., list[float]]:
    return hf_reference_losses


@pytest.fixture(scope="session")
def families() -> dict[str, tuple[str, dict[str, Any]]]:
    return FAMILIES
