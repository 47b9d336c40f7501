"""How a megatron job is planned (one trainer actor per rank, placement over the actor's devices) and what
the capability check accepts or refuses for it; the parameters issue 10 found accepted and ignored are now
read or refused by name, for both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.capabilities import BACKEND_PARAMETERS, MEGATRON_ARGUMENTS, unsupported_parameters
from runtime.devices import Device, DeviceKind
from runtime.roles.placement import (
    COLOCATED_GROUP,
    Role,
    UnsupportedTopology,
    plan_topology,
    train_world_size,
)
from runtime.spec import load_spec, parameter_defaults, read_spec_file

CPU = Device(DeviceKind.CPU)
GPU = Device(DeviceKind.CUDA)
EXAMPLES = Path(__file__).parents[3] / "examples"


def _values(example: str, **overrides) -> dict:
    raw, name = read_spec_file(EXAMPLES / example)
    raw = {k: ("/abs/path" if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    raw.update(overrides)
    return load_spec(raw, name=name).values()


def test_world_size_is_one_rank_per_device_and_at_least_the_model_parallel_size_on_cpu() -> None:
    assert train_world_size({"actor": [1, 2]}, 2, GPU) == 2
    assert train_world_size({"actor": [1, 4]}, 2, GPU) == 4  # TP=2 x DP=2
    assert train_world_size({"actor": [1, 1]}, 2, CPU) == 2  # two processes on one CPU slot
    with pytest.raises(UnsupportedTopology, match="multiple of the model-parallel size"):
        train_world_size({"actor": [1, 1]}, 2, GPU)
    with pytest.raises(UnsupportedTopology):
        train_world_size({"actor": [1, 3]}, 2, GPU)


def test_ranks_are_laid_out_over_the_actor_devices() -> None:
    colocated = plan_topology(
        {"actor": [1, 2], "rollout": [1, 2]}, colocate=True, with_rollout=True, device=CPU, train_world=2
    )
    assert colocated.groups == {COLOCATED_GROUP: 2}
    assert [(s.bundle_index, s.share) for s in colocated.role_slots(Role.ACTOR)] == [(0, 0.5), (1, 0.5)]
    assert [(s.bundle_index, s.share) for s in colocated.role_slots(Role.ROLLOUT)] == [(0, 0.5), (1, 0.5)]
    shared = plan_topology({"actor": [1, 1]}, colocate=False, with_rollout=False, device=CPU, train_world=2)
    assert shared.groups == {"actor": 1}
    assert [(s.bundle_index, s.share) for s in shared.role_slots(Role.ACTOR)] == [(0, 0.5), (0, 0.5)]
    # the torch backend keeps its one trainer on one device
    torch_plan = plan_topology({"actor": [1, 1]}, colocate=True, with_rollout=True, device=CPU)
    assert len(torch_plan.role_slots(Role.ACTOR)) == 1 and torch_plan.groups == {COLOCATED_GROUP: 1}
    with pytest.raises(UnsupportedTopology, match="one device"):
        plan_topology({"actor": [1, 2]}, colocate=False, with_rollout=False, device=CPU)


def test_role_plan_of_the_megatron_example() -> None:
    from runtime.pipeline import role_plan

    raw, name = read_spec_file(EXAMPLES / "grpo-arith-megatron.yaml")
    raw = {k: ("/abs/path" if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    spec = load_spec(raw, name=name)
    plan = role_plan(spec, 300, CPU)
    assert plan.backend == "megatron" and plan.train_world == 2
    assert plan.values["tensor_model_parallel_size"] == 2 and plan.values["hf_checkpoint"] == "/abs/path"
    assert plan.train_config.log_probs_max_tokens is None
    torch_plan = role_plan(
        load_spec(
            {
                **raw,
                "train-backend": "torch",
                "tensor-model-parallel-size": 1,
                "resource": {"actor": [1, 1], "rollout": [1, 1]},
            }
        ),
        300,
        CPU,
    )
    assert torch_plan.train_world is None and torch_plan.values == {}


def test_the_megatron_example_passes_the_capability_check() -> None:
    values = _values("grpo-arith-megatron.yaml")
    assert values["train_backend"] == "megatron" and values["bf16"]  # Relax's derived defaults included
    assert unsupported_parameters(values, parameter_defaults() or {}) == []
    # the same spec on the torch backend is refused for the Megatron arguments it does not read
    refused = unsupported_parameters({**values, "train_backend": "torch"}, parameter_defaults() or {})
    assert "tensor_model_parallel_size" in refused and "bf16" in refused


def test_megatron_arguments_are_spec_parameters_and_read_by_the_model() -> None:
    from jobspec.spec import FIELDS
    from runtime.train.megatron.model import ModelArgs

    assert MEGATRON_ARGUMENTS <= set(FIELDS)
    assert {f for f in ModelArgs.__dataclass_fields__ if f != "model_type"} <= MEGATRON_ARGUMENTS
    # the pipeline reads the context-parallel size itself (token budgets), whatever the backend
    assert MEGATRON_ARGUMENTS & BACKEND_PARAMETERS["torch"] == {"context_parallel_size"}


@pytest.mark.parametrize("backend", ["torch", "megatron"])
@pytest.mark.parametrize(
    "overrides,refused",
    [
        ({"sglang": {"mem_fraction_static": 0.5, "port": 30000}}, "sglang_port=30000"),  # the platform's flag
        ({"sglang_profile": True}, "sglang_profile"),
        ({"true_on_policy_mode": True, "global_batch_size": 128}, "true_on_policy_mode=True"),
        ({"checkpoint_engine_backend": "ipc"}, "checkpoint_engine_backend='ipc'"),
        ({"reward_num_workers": 4}, "reward_num_workers=4"),
        ({"colocate": False, "offload_train": True}, "offload_train=True"),
        ({"colocate": False, "offload": True}, "offload=True"),
        ({"offload_rollout": False}, "offload_rollout=False"),  # colocated roles always offload
    ],
)
def test_accepted_and_ignored_parameters_are_now_refused(backend: str, overrides: dict, refused: str) -> None:
    example = "grpo-arith-megatron.yaml" if backend == "megatron" else "grpo-arith.yaml"
    values = {**_values(example), **overrides}
    assert refused in unsupported_parameters(values, parameter_defaults() or {})


def test_log_probs_max_tokens_per_gpu_is_read_by_both_backends() -> None:
    from runtime.train.torch_backend import log_prob_batches
    from runtime.types import RolloutBatch, Sample

    samples = [Sample(i, i, "p", tokens=list(range(3, 13)), response_length=4) for i in range(6)]
    batch = RolloutBatch.from_samples(samples, 0)
    assert [b.batch_size for b in log_prob_batches(batch, 25)] == [2, 2, 2]
    assert [b.batch_size for b in log_prob_batches(batch, None)] == [6]
    for example in ("grpo-arith.yaml", "grpo-arith-megatron.yaml"):
        values = _values(example, **{"log-probs-max-tokens-per-gpu": 512})
        assert unsupported_parameters(values, parameter_defaults() or {}) == []


def test_the_tokenizer_is_the_checkpoints() -> None:
    defaults = parameter_defaults() or {}
    values = _values("grpo-arith-megatron.yaml")
    assert values["tokenizer_model"] == values["hf_checkpoint"]  # derived, as Relax does
    other = {**values, "tokenizer_model": "/elsewhere/tokenizer"}
    assert "tokenizer_model='/elsewhere/tokenizer'" in unsupported_parameters(other, defaults)
    # submitted: both as written; in the driver: --hf-checkpoint resolved by the platform, the derived
    # --tokenizer-model still the reference that was compared at submission
    written = {**values, "hf_checkpoint": "job://sft-arith/hf", "tokenizer_model": "job://sft-arith/hf"}
    assert unsupported_parameters(written, defaults) == []
    assert unsupported_parameters({**written, "tokenizer_model": "artifacts://tok"}, defaults) != []
    resolved = {**written, "hf_checkpoint": "/platform/jobs/sft-arith/hf"}
    assert unsupported_parameters(resolved, defaults) == []


def test_true_on_policy_mode_with_one_optimizer_step_per_rollout() -> None:
    """Relax's true-on-policy mode takes the train forward's log-probs as the old ones: the same numbers as
    the pre-update recompute when one optimizer step consumes the whole rollout."""
    defaults = parameter_defaults() or {}
    for example in ("grpo-arith.yaml", "grpo-arith-megatron.yaml"):
        values = _values(example, **{"true-on-policy-mode": True})  # 32 x 8 samples, global batch 256
        assert unsupported_parameters(values, defaults) == []
        split = _values(
            example, **{"true-on-policy-mode": True, "global-batch-size": 128, "micro-batch-size": 128}
        )
        assert "true_on_policy_mode=True" in unsupported_parameters(split, defaults)
