"""The spec loader and the torch backend's declared capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.capabilities import unsupported_parameters
from runtime.spec import RuntimeSpec, load_spec, read_spec_file


def test_from_mapping_accepts_hyphens_and_keeps_unknown_keys() -> None:
    spec = RuntimeSpec.from_mapping(
        {
            "rollout-batch-size": 8,
            "--lr": 1e-3,
            "eps_clip_high": None,
            "resource": '{"actor": [1, 1]}',
            "tensor_model_parallel_size": 1,
        }
    )
    assert spec.rollout_batch_size == 8 and spec.lr == 1e-3
    assert spec.effective_eps_clip_high == 0.2
    assert spec.resource == {"actor": [1, 1]}
    assert spec.extra == {"tensor_model_parallel_size": 1}


def test_derived_batch_sizes_and_total_rollouts() -> None:
    spec = RuntimeSpec(rollout_batch_size=8, n_samples_per_prompt=4, num_steps_per_rollout=2, num_epoch=3)
    assert spec.samples_per_rollout == 32 and spec.effective_global_batch_size == 16
    assert spec.total_rollouts(dataset_size=20) == 7
    assert RuntimeSpec(loss_type="sft", rollout_batch_size=8, n_samples_per_prompt=4).samples_per_rollout == 8


def test_read_spec_file_forms(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: x\nspec:\n  lr: 0.1\n")
    (tmp_path / "b.json").write_text('{"lr": 0.2}')
    assert read_spec_file(tmp_path / "a.yaml") == ({"lr": 0.1}, "x")
    assert read_spec_file(tmp_path / "b.json") == ({"lr": 0.2}, None)


def test_load_spec_normalized_skips_jobspec() -> None:
    spec = load_spec({"loss_type": "sft", "rollout_batch_size": 4}, normalized=True)
    assert spec.is_sft


def test_unsupported_parameters_are_named() -> None:
    defaults = {"lr": 1e-6, "opd_teacher_url": None, "tensor_model_parallel_size": 1, "kl_loss_type": "k1"}
    values = {
        "lr": 1e-3,
        "opd_teacher_url": "http://teacher:30010/generate",
        "tensor_model_parallel_size": 1,
        "kl_loss_type": "k5",
        "over_sampling_batch_size": 16,
        "rollout_batch_size": 8,
    }
    assert unsupported_parameters(values, defaults) == ["kl_loss_type='k5'", "opd_teacher_url"]
    assert unsupported_parameters({**values, "num_iters_per_train_update": 2}, defaults)[-1] == (
        "opd_teacher_url"
    )
    # on-policy distillation: the trainer's teacher is honoured, an SGLang teacher and top-k KLs are not
    opd = {"use_opd": True, "opd_type": "megatron", "opd_kl_type": "low_var_kl"}
    assert unsupported_parameters(opd, {}) == []
    refused = {**opd, "opd_type": "sglang", "opd_kl_type": "jsd"}
    assert unsupported_parameters(refused, {}) == ["opd_kl_type='jsd'", "opd_type='sglang'"]
    assert "num_iters_per_train_update=2" in unsupported_parameters(
        {**values, "num_iters_per_train_update": 2}, defaults
    )


@pytest.mark.parametrize("example", ["sft-arith.yaml", "grpo-arith.yaml", "sft-chat.yaml", "grpo-chat.yaml"])
def test_examples_normalize_with_jobspec_and_pass_the_capability_check(example: str) -> None:
    jobspec = pytest.importorskip("jobspec")
    from runtime.spec import parameter_defaults

    raw, name = read_spec_file(Path(__file__).parents[3] / "examples" / example)
    raw = {k: ("/abs/path" if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    spec = load_spec(raw, name=name)
    assert spec.train_backend == "torch" and name
    assert unsupported_parameters(spec.values(), parameter_defaults() or {}) == []
    assert jobspec is not None


def test_demo_resolves_references_like_the_platform(tmp_path: Path) -> None:
    from runtime.demo import prepare, resolve

    job = tmp_path / "jobs" / "grpo"
    assert resolve("artifacts://models/tiny", root=tmp_path, job_dir=job) == str(
        tmp_path / "artifacts/models/tiny"
    )
    assert resolve("job://sft-arith/hf", root=tmp_path, job_dir=job) == str(tmp_path / "jobs/sft-arith/hf")
    assert resolve("ckpt", root=tmp_path, job_dir=job) == str(job / "ckpt")
    assert resolve("/abs", root=tmp_path, job_dir=job) == "/abs"
    name, spec_file = prepare(tmp_path, "grpo-arith.yaml", {"seed": 7})
    spec, _ = read_spec_file(spec_file)
    assert name == "grpo-arith" and spec["seed"] == 7
    assert spec["hf-checkpoint"] == spec["ref-load"] == str(tmp_path / "jobs/sft-arith/hf")
    assert spec["eval-prompt-data"] == ["arith", str(tmp_path / "artifacts/datasets/arith/test.jsonl")]
