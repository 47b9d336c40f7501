"""On-policy distillation with the megatron backend on CPU (gloo), two ranks (TP=2). A checkpoint root of this
backend holds the tiny model after 2 SFT steps (iteration 0) and after 12 (iteration 1). The student starts at
iteration 1 and the teacher is `opd-teacher-load` at `opd-teacher-ckpt-step 0`: its log-probs equal a Hugging
Face forward of iteration 0's weights, and a few rounds of OPD (`opd-only-reward`, advantage mode) on the
student's own samples bring the student's KL to the teacher (`opd/kl`) down."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.unit.runtime import ranks

PROMPT, RESPONSE, PROMPTS, SAMPLES_PER_PROMPT, ROUNDS = 4, 6, 4, 4, 6


def _values(model: Path) -> dict[str, Any]:
    from runtime.spec import load_spec

    spec = load_spec(
        {
            "train-backend": "megatron",
            "hf-checkpoint": str(model),
            "prompt-data": "unused.jsonl",
            "rollout-batch-size": PROMPTS,
            "num-rollout": 1,
            "rm-type": "math",
            "colocate": True,
            "tensor-model-parallel-size": 2,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
            "hidden-dropout": 0.0,
            "attention-dropout": 0.0,
        }
    )
    values = spec.values()
    values["bf16"] = False  # fp32: the teacher's log-probs compare with an HF forward to 1e-4
    return values


def _teacher_batch(vocab: int):
    """PROMPTS prompts, each with the one response the teacher is taught (SFT)."""
    from runtime.types import RolloutBatch, Sample

    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            i,
            i,
            "p",
            tokens=torch.randint(3, vocab, (PROMPT + RESPONSE,), generator=g).tolist(),
            response_length=RESPONSE,
        )
        for i in range(PROMPTS)
    ]
    return RolloutBatch.from_samples(samples, 0)


def _student_samples(student: Any, prompts: torch.Tensor, seed: int) -> list[list[int]]:
    """SAMPLES_PER_PROMPT responses of RESPONSE tokens per prompt, sampled from the student (rank 0)."""
    torch.manual_seed(seed)
    out = student.generate(
        prompts.repeat_interleave(SAMPLES_PER_PROMPT, dim=0),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=RESPONSE,
        min_new_tokens=RESPONSE,
        pad_token_id=0,
    )
    return out.tolist()


def _worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import dataclasses

    from transformers import AutoModelForCausalLM

    from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages_and_returns
    from runtime.algos.losses import LossConfig
    from runtime.algos.opd import OPDConfig, opd_metrics
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class
    from runtime.train.megatron.parallel import destroy_parallel
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig
    from runtime.types import RolloutBatch, Sample

    root = Path(out).parent
    context = TrainContext(rank, world, "127.0.0.1", port, _values(Path(model)))
    backend_cls = train_backend_class("megatron")
    student_hf = AutoModelForCausalLM.from_pretrained(model).eval()
    taught = _teacher_batch(student_hf.config.vocab_size)

    # a checkpoint root of this backend: the tiny model after 2 SFT steps on `taught` (iteration 0: the
    # teacher) and after 10 more (iteration 1: the student, sure of the taught responses)
    sft = TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=1e-2), weight_decay=0.0, micro_batch_size=4)
    trained = backend_cls(model, sft, device=Device.detect(), context=context)
    for _ in range(2):
        trained.train_step(taught)
    trained.save_checkpoint(str(root / "ckpt"), 0, {})
    trained.export_hf(str(root / "teacher-hf"), 0)
    for _ in range(10):
        trained.train_step(taught)
    trained.save_checkpoint(str(root / "ckpt"), 1, {})
    del trained
    destroy_parallel(process_group=False)

    # the student starts at iteration 1 (`ref-load`, `ref-ckpt-step`) and is distilled from iteration 0
    opd = OPDConfig(only_reward=True)
    config = TrainConfig(
        lr_schedule=LRSchedule(lr=1e-2),
        weight_decay=0.0,
        global_batch_size=8,
        micro_batch_size=8,
        loss=LossConfig(opd=opd),
        ref_load=str(root / "ckpt"),
        ref_ckpt_step=1,
        opd_teacher_load=str(root / "ckpt"),
        opd_teacher_ckpt_step=0,
    )
    student = backend_cls(model, config, device=Device.detect(), context=context)
    result: dict[str, Any] = {"teacher": student.compute_log_probs(taught).teacher_log_probs, "kl": []}
    prompts = taught.tokens[:, :PROMPT]
    for round_ in range(ROUNDS):
        weights = student.named_weights()  # gathered on rank 0, which samples
        rows: list[Any] = [None]
        if rank == 0:
            missing, unexpected = student_hf.load_state_dict(weights, strict=False)
            assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
            rows[0] = _student_samples(student_hf, prompts, seed=round_)
        dist.broadcast_object_list(rows, src=0)
        samples = [
            Sample(i, i // SAMPLES_PER_PROMPT, "p", tokens=row, response_length=RESPONSE)
            for i, row in enumerate(rows[0])
        ]
        batch = student.compute_log_probs(RolloutBatch.from_samples(samples, 0))
        result["kl"].append(opd_metrics(batch.old_log_probs, batch.teacher_log_probs, batch.loss_mask, opd))
        out_ = compute_advantages_and_returns(
            "grpo",
            AdvantageInputs(
                batch.rewards,
                batch.group_index,
                batch.loss_mask,
                log_probs=batch.old_log_probs,
                teacher_log_probs=batch.teacher_log_probs,
            ),
            AdvantageConfig(opd=opd),
        )
        batch = dataclasses.replace(batch, advantages=out_.advantages, returns=out_.returns)
        student.train_step(batch)
    if rank == 0:
        torch.save(result, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)


def test_megatron_teacher_log_probs_and_distillation(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    from runtime.algos.logprobs import token_log_probs
    from runtime.train.megatron.parallel import free_port
    from runtime.train.torch_backend import position_ids_for

    out = tmp_path / "result.pt"
    # the spawned ranks import this module (by its importlib-mode name) from the repository root
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    ranks.spawn(_worker, (2, free_port(), str(tiny), str(out)))
    got = torch.load(out, weights_only=False)

    # iteration 0 of the checkpoint root (not the latest, 1) is the teacher: an HF forward of its export
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher-hf").eval()
    taught = _teacher_batch(hf.config.vocab_size)
    with torch.no_grad():
        logits = hf(
            input_ids=taught.tokens,
            attention_mask=taught.attention_mask,
            position_ids=position_ids_for(taught.attention_mask),
        ).logits
    want = token_log_probs(logits, taught.tokens) * taught.loss_mask
    assert float((got["teacher"] - want).abs().max()) < 1e-4

    kl = [m["opd/kl"] for m in got["kl"]]
    assert kl[0] > 0.5, kl  # the student is surer of its (taught) samples than the teacher
    assert sum(kl[-2:]) / 2 < 0.25 * kl[0], kl
    assert all(m["opd/teacher_log_prob"] < 0 for m in got["kl"])
