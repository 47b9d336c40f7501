"""normalize(): the public API, key spellings, type and choice errors, passthrough, schema, purity."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pydantic
import pytest

import jobspec
from jobspec import GpuGroup, JobSpec, NormalizedSpec, ResourceDemand, SpecError, SpecIssue, normalize

MINIMAL: dict[str, Any] = {
    "hf-checkpoint": "/models/qwen",
    "ref-load": "/ckpt/ref",
    "prompt-data": "/data/train.jsonl",
    "input-key": "prompt",
    "label-key": "label",
    "rm-type": "math",
    "rollout-batch-size": 8,
    "n-samples-per-prompt": 4,
    "rollout-max-response-len": 1024,
    "rollout-temperature": 0.8,
    "global-batch-size": 32,
    "num-rollout": 100,
    "lr": 1e-6,
    "advantage-estimator": "grpo",
    "eps-clip": 0.2,
    "use-kl-loss": True,
    "kl-loss-coef": 0.01,
    "save": "/out/ckpt",
    "save-interval": 20,
    "colocate": True,
    "resource": {"actor": [1, 4], "rollout": [1, 4]},
    "train-backend": "megatron",
    "loss-type": "policy_loss",
    "seed": 42,
}


def errors(obj: Any = None, argv: list[str] | None = None) -> list[SpecIssue]:
    with pytest.raises(SpecError) as info:
        normalize(obj=obj, argv=argv)
    return info.value.errors


def test_integration_fields_from_object() -> None:
    res = normalize(obj=MINIMAL)
    assert isinstance(res, NormalizedSpec) and isinstance(res.spec, JobSpec)
    s = res.spec
    assert (s.hf_checkpoint, s.prompt_data, s.input_key, s.label_key, s.rm_type) == (
        "/models/qwen",
        "/data/train.jsonl",
        "prompt",
        "label",
        "math",
    )
    assert (s.rollout_batch_size, s.n_samples_per_prompt, s.rollout_max_response_len) == (8, 4, 1024)
    assert (s.rollout_temperature, s.global_batch_size, s.num_rollout, s.lr) == (0.8, 32, 100, 1e-6)
    assert (s.advantage_estimator, s.eps_clip, s.use_kl_loss, s.kl_loss_coef) == ("grpo", 0.2, True, 0.01)
    assert (s.save, s.save_interval, s.colocate, s.seed) == ("/out/ckpt", 20, True, 42)
    assert s.resource == {"actor": [1, 4], "rollout": [1, 4]}
    assert (s.train_backend, s.loss_type) == ("megatron", "policy_loss")
    # defaults filled, derived defaults applied and recorded
    assert s.rollout_top_p == 1.0 and s.eps_clip_high == 0.2
    assert res.derived["eps_clip_high"] == 0.2 and res.derived["offload_train"] is True
    assert isinstance(res.demand, ResourceDemand) and all(isinstance(g, GpuGroup) for g in res.demand.groups)


def test_argv_and_object_give_the_same_spec() -> None:
    argv = [
        "--hf-checkpoint",
        "/models/qwen",
        "--ref-load",
        "/ckpt/ref",
        "--prompt-data",
        "/data/train.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--rm-type",
        "math",
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "1024",
        "--rollout-temperature",
        "0.8",
        "--global-batch-size",
        "32",
        "--num-rollout",
        "100",
        "--lr",
        "1e-6",
        "--advantage-estimator",
        "grpo",
        "--eps-clip",
        "0.2",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.01",
        "--save",
        "/out/ckpt",
        "--save-interval",
        "20",
        "--colocate",
        "--resource",
        '{"actor": [1, 4], "rollout": [1, 4]}',
        "--train-backend",
        "megatron",
        "--loss-type",
        "policy_loss",
        "--seed",
        "42",
    ]
    assert normalize(argv=argv).spec == normalize(obj=MINIMAL).spec


def test_keys_with_underscores_or_hyphens() -> None:
    underscored = {k.replace("-", "_"): v for k, v in MINIMAL.items()}
    assert normalize(obj=underscored).spec == normalize(obj=MINIMAL).spec


def test_exactly_one_input() -> None:
    with pytest.raises(TypeError):
        normalize()
    with pytest.raises(TypeError):
        normalize(obj=MINIMAL, argv=[])


def test_unknown_key_did_you_mean_underscore_and_hyphen() -> None:
    (issue,) = [i for i in errors({**MINIMAL, "rollout_bach_size": 3}) if i.code == "spec.unknown_key"]
    assert issue.field == "rollout-bach-size" and "rollout_bach_size" in issue.message
    assert issue.hint == "did you mean 'rollout_batch_size'?"
    (issue,) = [i for i in errors({**MINIMAL, "rollout-temprature": 1.0}) if i.code == "spec.unknown_key"]
    assert issue.hint == "did you mean --rollout-temperature?"


def test_unknown_flag_did_you_mean() -> None:
    (issue,) = errors(argv=["--rollout-batch-size", "8", "--num-rollouts", "5"])[:1]
    assert issue.code == "spec.unknown_key" and issue.field == "num-rollouts"
    assert "--num-rollout" in issue.hint


def test_megatron_looking_unknown_flag_is_refused() -> None:
    issues = errors({**MINIMAL, "tensor-model-parallel-sizes": 2, "moe-not-a-flag": 1})
    assert {i.field for i in issues if i.code == "spec.unknown_key"} == {
        "tensor-model-parallel-sizes",
        "moe-not-a-flag",
    }


def test_wrong_type_names_field_value_and_expected_type() -> None:
    (issue,) = errors({**MINIMAL, "rollout-batch-size": "eight"})
    assert issue.code == "spec.invalid_type" and issue.field == "rollout-batch-size"
    assert "'eight'" in issue.message and "integer" in issue.message
    (issue,) = errors({**MINIMAL, "colocate": "yes"})
    assert issue.field == "colocate" and "boolean" in issue.message
    (issue,) = errors(argv=["--rollout-batch-size", "x8"])[:1]
    assert (
        issue.code == "spec.invalid_type" and issue.field == "rollout-batch-size" and "'x8'" in issue.message
    )


def test_out_of_range_and_bad_resource() -> None:
    (issue,) = errors({**MINIMAL, "n-samples-per-prompt": 0})
    assert issue.code == "spec.out_of_range" and ">= 1" in issue.message
    (issue,) = errors({**MINIMAL, "resource": {"actor": [1], "rollout": [1, 4]}})
    assert issue.field == "resource" and "[replicas, gpus]" in issue.message


def test_invalid_choice_lists_allowed_values() -> None:
    (issue,) = errors({**MINIMAL, "advantage-estimator": "grpoo"})
    assert issue.code == "spec.invalid_choice" and issue.field == "advantage-estimator"
    assert "'grpoo'" in issue.message and "reinforce_plus_plus_baseline" in issue.message
    assert "grpo" in issue.hint
    (issue,) = errors({**MINIMAL, "advantage-estimator": "on_policy_distillation"})
    assert "--use-opd" in issue.hint


def test_all_issues_collected_and_serializable() -> None:
    with pytest.raises(SpecError) as info:
        normalize(obj={**MINIMAL, "lr": "fast", "bogus": 1, "kl-coef": 0.5, "save-interval": 0})
    codes = [i.code for i in info.value.errors]
    assert {
        "spec.invalid_type",
        "spec.unknown_key",
        "spec.out_of_range",
        "rule.kl_coef_and_kl_loss_coef",
    } <= set(codes)
    payload = json.loads(json.dumps(info.value.to_dict()))
    assert {"code", "field", "fields", "message", "hint", "severity"} <= set(payload["issues"][0])
    assert "error(s) in job spec" in str(info.value)


def test_rule_about_a_badly_typed_field_is_not_repeated() -> None:
    issues = errors({**MINIMAL, "save": 5})
    assert [i.code for i in issues] == ["spec.invalid_type"]


def test_spec_is_frozen_and_forbids_extra() -> None:
    spec = normalize(obj=MINIMAL).spec
    with pytest.raises(pydantic.ValidationError):
        spec.lr = 1.0  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        JobSpec(not_a_field=1)  # type: ignore[call-arg]


def test_to_dict_is_flat_json_and_complete() -> None:
    res = normalize(obj=MINIMAL)
    data = json.loads(json.dumps(res.spec.to_dict()))
    assert set(data) == set(JobSpec.model_fields) and data["rollout_batch_size"] == 8
    assert json.loads(json.dumps(res.to_dict()))["demand"]["total_gpus"] == 4


def test_json_schema_has_groups_and_flags() -> None:
    schema = JobSpec.model_json_schema()
    prop = schema["properties"]["rollout_batch_size"]
    assert prop["group"] == "rollout" and prop["flag"] == "rollout-batch-size" and prop["description"]
    assert schema["properties"]["advantage_estimator"]["enum"][0] == "grpo"
    assert {g["group"] for g in schema["x-groups"]} >= {
        "cluster",
        "megatron-network-size",
        "megatron-moe",
        "relax-wandb",
        "sglang",
        "opd",
    }


def test_size_strings_become_bytes() -> None:
    res = normalize(
        obj={**MINIMAL, "update-weight-buffer-size": "1GB", "train-memory-margin-bytes": "512MiB"}
    )
    assert res.spec.update_weight_buffer_size == 1024**3
    assert res.spec.train_memory_margin_bytes == 512 * 1024**2
    assert normalize(obj=MINIMAL).spec.update_weight_buffer_size == 512 * 1024**2


def test_sglang_passthrough_object_and_argv() -> None:
    res = normalize(
        obj={
            **MINIMAL,
            "sglang-mem-fraction-static": 0.7,
            "sglang_enable_dp_attention": True,
            "sglang": {"cuda-graph-bs": [1, 2, 4], "log_level": "warning"},
        }
    )
    assert res.spec.sglang == {
        "mem_fraction_static": 0.7,
        "enable_dp_attention": True,
        "cuda_graph_bs": [1, 2, 4],
        "log_level": "warning",
    }
    argv = res.spec.to_argv()
    assert argv[argv.index("--sglang-mem-fraction-static") + 1] == "0.7"
    assert "--sglang-enable-dp-attention" in argv
    assert argv[argv.index("--sglang-cuda-graph-bs") + 1 : argv.index("--sglang-cuda-graph-bs") + 4] == [
        "1",
        "2",
        "4",
    ]
    assert normalize(argv=argv).spec == res.spec


def test_sglang_passthrough_canonical_form() -> None:
    res = normalize(
        obj={**MINIMAL, "sglang": {"tp_size": "2", "one": [8], "off": False, "json_args": {"a": 1}}}
    )
    assert res.spec.sglang == {"tp_size": 2, "one": 8, "json_args": '{"a":1}'}
    assert any(w.code == "spec.sglang_value_dropped" for w in res.warnings)


def test_typed_sglang_profile_fields_are_not_passthrough() -> None:
    res = normalize(obj={**MINIMAL, "sglang": {"profile": True}, "sglang-profile-num-steps": 5})
    assert (
        res.spec.sglang_profile is True and res.spec.sglang_profile_num_steps == 5 and res.spec.sglang == {}
    )


def test_no_prefix_only_for_negatable_flags() -> None:
    res = normalize(obj={**MINIMAL, "no-offload-rollout": True})
    assert res.spec.offload_rollout is False
    assert any(i.code == "spec.unknown_key" for i in errors({**MINIMAL, "no-colocate": True}))


def test_path_and_function_path_fields() -> None:
    paths = jobspec.path_fields()
    for name in (
        "hf_checkpoint",
        "load",
        "ref_load",
        "prompt_data",
        "eval_prompt_data",
        "critic_load",
        "opd_teacher_load",
        "eval_config",
        "custom_config_path",
        "load_debug_rollout_data",
    ):
        assert paths[name] == "input", name
    for name in ("save", "save_hf", "critic_save", "save_debug_rollout_data", "timeline_dump_dir"):
        assert paths[name] == "output", name
    functions = jobspec.function_path_fields()
    assert "custom_loss_function_path" in functions and "rollout_function_path" in functions
    assert all(jobspec.FIELDS[n].kind in ("str", "list") for n in functions)
    assert all(n.endswith("_path") or n.endswith("_paths") for n in functions)


def test_megatron_fields_are_an_explicit_list() -> None:
    names = set(jobspec.megatron_fields())
    assert {
        "tensor_model_parallel_size",
        "num_layers",
        "hidden_size",
        "bf16",
        "loss_scale",
        "micro_batch_size",
        "use_distributed_optimizer",
        "attention_backend",
        "moe_router_topk",
        "recompute_granularity",
    } <= names
    assert "rollout_batch_size" not in names


def test_jobspec_stays_pure() -> None:
    code = (
        "import sys, jobspec; jobspec.normalize(obj={'rollout_batch_size': 1, 'num_rollout': 1, "
        "'hf_checkpoint': 'x', 'prompt_data': 'y', 'colocate': True}); "
        "bad = [m for m in ('sqlalchemy', 'ray', 'torch', 'celery', 'fastapi', 'api', 'scheduler', 'runtime') "
        "if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_object_conveniences_for_lists() -> None:
    res = normalize(
        obj={**MINIMAL, "rollout-stop": "</answer>", "eval-prompt-data": {"aime": "/d/aime.jsonl"}}
    )
    assert res.spec.rollout_stop == ["</answer>"]
    assert res.spec.eval_prompt_data == ["aime", "/d/aime.jsonl"]


def test_yaml_exponent_floats() -> None:
    import yaml

    obj = yaml.safe_load("lr: 1e-6\nkl-loss-coef: 1e-3\nrollout-batch-size: 8\n")
    assert obj["lr"] == "1e-6"  # YAML 1.1 reads it as text
    res = normalize(obj={**MINIMAL, **obj})
    assert res.spec.lr == 1e-6 and res.spec.kl_loss_coef == 1e-3
    (issue,) = errors({**MINIMAL, "lr": "fast"})
    assert issue.code == "spec.invalid_type"
