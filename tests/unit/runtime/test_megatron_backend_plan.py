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
    critic_world_size,
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
    ],
)
def test_accepted_and_ignored_parameters_are_now_refused(backend: str, overrides: dict, refused: str) -> None:
    example = "grpo-arith-megatron.yaml" if backend == "megatron" else "grpo-arith.yaml"
    values = {**_values(example), **overrides}
    assert refused in unsupported_parameters(values, parameter_defaults() or {})


def test_colocated_roles_may_keep_both_sides_resident() -> None:
    # the idle side's release at each turn is optional when colocated (both sides stay on the device)
    for example in ("grpo-arith.yaml", "grpo-arith-megatron.yaml"):
        values = {**_values(example), "offload_train": False, "offload_rollout": False}
        assert values["colocate"] and unsupported_parameters(values, parameter_defaults() or {}) == []


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


def test_a_critic_on_several_devices_runs_one_rank_per_device() -> None:
    """Relax's critic runs in the actor's parallel layout on its own `resource` entry: N devices are N
    megatron-core ranks (on CPU at least the model-parallel size, as the trainer's); one device stays one
    rank, model-parallel sizes 1 (the torch backend's critic is one process: no world at all)."""
    assert critic_world_size({"critic": [1, 1]}, 2, GPU) == 1
    assert critic_world_size({"actor": [1, 8]}, 2, GPU) == 1  # no entry: one device
    assert critic_world_size({"critic": [1, 8]}, 2, GPU) == 8  # TP=2 x DP=4
    assert critic_world_size({"critic": [1, 2]}, 4, CPU) == 4  # two processes per CPU slot
    with pytest.raises(UnsupportedTopology, match="resource.critic has 3"):
        critic_world_size({"critic": [1, 3]}, 2, GPU)
    ppo = {"actor": [1, 4], "critic": [1, 4], "rollout": [1, 4], "advantages": [1, 0]}
    topology = plan_topology(
        ppo, colocate=True, with_rollout=True, device=GPU, with_critic=True, train_world=4, critic_world=4
    )
    # Relax's colocated PPO (jobspec.demand.role_layout): engines over the actor's 4 devices, then the critic's
    assert topology.groups == {COLOCATED_GROUP: 8}
    assert [(s.group, s.bundle_index, s.share) for s in topology.role_slots(Role.CRITIC)] == [
        (COLOCATED_GROUP, 4 + i, 0.5) for i in range(4)
    ]
    assert [s.bundle_index for s in topology.role_slots(Role.ROLLOUT)] == list(range(8))
    on_cpu = plan_topology(
        {**ppo, "critic": [1, 2]},
        colocate=True,
        with_rollout=True,
        device=CPU,
        with_critic=True,
        train_world=4,
        critic_world=4,
    )
    assert [(s.bundle_index, s.share) for s in on_cpu.role_slots(Role.CRITIC)] == [
        (4, 0.25),
        (4, 0.25),
        (5, 0.25),
        (5, 0.25),
    ]


def test_role_plan_gives_a_megatron_critic_the_jobs_layout_on_its_devices() -> None:
    from runtime.pipeline import role_plan

    ppo = {
        "advantage-estimator": "ppo",
        "resource": {"actor": [1, 2], "critic": [1, 2], "rollout": [1, 2], "advantages": [1, 0]},
    }
    raw, name = read_spec_file(EXAMPLES / "grpo-arith-megatron.yaml")
    raw = {k: ("/abs/path" if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    plan = role_plan(load_spec({**raw, **ppo, "tensor-model-parallel-size": 2}, name=name), 10, GPU)
    assert plan.critic is not None and plan.critic.world == 2 and plan.train_world == 2
    assert plan.critic.values["tensor_model_parallel_size"] == 2  # the critic splits the model as the actor
    one = {
        **ppo,
        "resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 1], "advantages": [1, 0]},
        "tensor-model-parallel-size": 1,
    }
    assert role_plan(load_spec({**raw, **one}, name=name), 10, GPU).critic.world == 1  # type: ignore[union-attr]
    torch_raw = {
        **{k: v for k, v in raw.items() if k not in ("train-backend", "tensor-model-parallel-size")},
        **one,
        "train-backend": "torch",
    }
    torch_plan = role_plan(load_spec(torch_raw, name=name), 10, GPU)
    assert torch_plan.critic is not None and torch_plan.critic.world is None


def test_the_capability_check_accepts_a_critic_whose_devices_hold_the_layout() -> None:
    defaults = parameter_defaults() or {}
    ppo = {
        "advantage-estimator": "ppo",
        "resource": {"actor": [1, 2], "critic": [1, 2], "rollout": [1, 2], "advantages": [1, 0]},
    }
    values = _values("grpo-arith-megatron.yaml", **ppo)  # TP=2
    assert values["tensor_model_parallel_size"] == 2

    def refused(critic: list[int], **overrides: object) -> list[str]:
        resource = {"actor": [1, 2], "critic": critic, "rollout": [1, 2], "advantages": [1, 0]}
        return unsupported_parameters({**values, "resource": resource, **overrides}, defaults)

    assert refused([1, 1]) == []  # one rank, model-parallel sizes 1
    assert refused([1, 2]) == [] and refused([1, 4]) == []  # TP=2, and TP=2 x DP=2
    assert [r.split("=")[0] for r in refused([1, 3])] == ["resource"]  # 3 ranks cannot hold TP=2
    # experts: EP x ETP x PP ranks per expert group (EP=4, ETP=1: 2 ranks hold TP=2 but not EP=4)
    moe = {"expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1}
    assert [r.split("=")[0] for r in refused([1, 2], **moe)] == ["resource"]
    assert refused([1, 4], **moe) == []
    # the torch backend's critic is one process
    resource = {"actor": [1, 1], "critic": [1, 2], "rollout": [1, 1], "advantages": [1, 0]}
    torch_values = _values("grpo-arith.yaml", **{**ppo, "resource": resource})
    assert unsupported_parameters({**torch_values, "resource": resource}, defaults) == [
        f"resource={resource!r}"
    ]


# The arguments of Relax's own PPO script (redai-studio/Relax scripts/training/text/run-qwen3-4B-8xgpu-ppo.sh,
# with its model flags from scripts/models/qwen3-4B.sh), as bash hands them to `relax.entrypoints.train`; the
# paths are placeholders and the SGLang CUDA-graph sizes shortened.
RELAX_PPO_SCRIPT = [
    "--resource", '{"actor": [1, 8], "critic": [1, 8], "rollout": [1, 8], "advantages": [1, 0]}',
    "--max-staleness", "0", "--num-data-storage-units", "1", "--colocate", "--offload-rollout",
    "--use-health-check",
    "--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728",
    "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
    "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "151936", "--qk-layernorm",
    "--no-rope-fusion",
    "--hf-checkpoint", "/m/Qwen3-4B", "--ref-load", "/m/Qwen3-4B", "--megatron-to-hf-mode", "bridge",
    "--warm-hf-checkpoint-page-cache", "--load", "/x/actor/", "--save", "/x/actor/", "--save-interval", "50",
    "--max-actor-ckpt-to-keep", "1", "--critic-load", "/x/critic/", "--critic-save", "/x/critic/",
    "--prompt-data", "/d/dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
    "--apply-chat-template", "--rollout-shuffle", "--rm-type", "dapo", "--reward-key", "score",
    "--num-rollout", "1000", "--rollout-batch-size", "32", "--n-samples-per-prompt", "4",
    "--rollout-max-response-len", "8192", "--rollout-temperature", "0.8", "--global-batch-size", "128",
    "--balance-data", "--use-fault-tolerance",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    "--advantage-estimator", "ppo", "--gamma", "1.0", "--lambd", "1.0", "--eps-clip", "0.2",
    "--eps-clip-high", "0.2", "--entropy-coef", "0.0", "--use-kl-loss", "--kl-loss-coef", "0.0",
    "--kl-loss-type", "k1", "--kl-coef", "0.0", "--normalize-advantages", "--value-clip", "0.5",
    "--critic-lr", "1e-5", "--num-critic-only-steps", "1", "--critic-lr-warmup-iters", "1",
    "--use-clearml", "--use-metrics-service", "--tb-project-name", "Relax/dev/dapo-math-ppo",
    "--tb-experiment-name", "qwen3-4B-ppo-8x",
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "10240", "--log-probs-max-tokens-per-gpu", "10240",
    "--no-rope-fusion",
    "--log-passrate", "--skip-eval-before-train", "--eval-interval", "20",
    "--eval-prompt-data", "aime", "/d/aime-2024.jsonl", "--n-samples-per-eval-prompt", "8",
    "--eval-max-response-len", "8192", "--eval-top-p", "0.7",
    "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.8",
    "--sglang-cuda-graph-bs", "1", "2", "4", "8", "16",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
]  # fmt: skip


def test_relax_ppo_script_is_refused_only_for_what_the_platform_does_not_run() -> None:
    """PPO without --use-rollout-logprobs, and the critic on 8 GPUs in the actor's layout (TP=2, SP, DP=4),
    pass; what is left is refused for other reasons: engines of 2 GPUs (the built-in engine and the SGLang
    client run one GPU per engine) and ClearML. (`--use-health-check` runs: runtime/roles/engine_health.py.)"""
    from jobspec import FIELDS, normalize

    res = normalize(argv=RELAX_PPO_SCRIPT)
    values = res.spec.to_dict()
    assert values["train_backend"] == "megatron" and values["advantage_estimator"] == "ppo"
    assert not values["use_rollout_logprobs"] and values["resource"]["critic"] == [1, 8]
    defaults = {name: getattr(f, "default", None) for name, f in FIELDS.items()}
    assert unsupported_parameters(values, defaults) == [
        "rollout_num_gpus_per_engine=2",
        "use_clearml",
    ]
    assert critic_world_size(values["resource"], 2, GPU) == 8  # the critic's ranks: TP=2 x DP=4
    # the GPUs the scheduler reserves (the colocated rollout spans actor + critic) are the slots the roles take
    from jobspec.demand import compute_demand

    topology = plan_topology(
        values["resource"],
        colocate=True,
        with_rollout=True,
        device=GPU,
        with_critic=True,
        train_world=8,
        critic_world=8,
    )
    assert topology.groups == {COLOCATED_GROUP: 16}
    assert compute_demand(res.spec).total_gpus == topology.num_bundles == 16


@pytest.mark.parametrize(
    ("flags", "colocate", "resource", "groups"),
    [
        # slime-style scripts: --actor-num-nodes x --actor-num-gpus-per-node, engines on --rollout-num-gpus
        (
            ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "2"],
            False,
            {"actor": [1, 4], "rollout": [1, 2]},
            {"actor": 4, "rollout": 2},
        ),
        # colocated: Relax overrides --rollout-num-gpus to the actor's GPUs
        (
            ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "8"],
            True,
            {"actor": [1, 2], "rollout": [1, 2]},
            {COLOCATED_GROUP: 2},
        ),
    ],
)
def test_legacy_layout_flags_size_the_roles_as_resource_does(flags, colocate, resource, groups) -> None:
    """Without --resource, Relax's legacy --actor-num-nodes / --actor-num-gpus-per-node / --rollout-num-gpus
    (actor_num_nodes, actor_num_gpus_per_node, rollout_num_gpus) size the roles: jobspec derives the equivalent
    `resource` (rule.legacy_layout_resource), the capability check accepts them, and placement takes exactly
    the GPUs the scheduler reserves for the job."""
    from jobspec import FIELDS, normalize
    from jobspec.demand import compute_demand

    argv = [
        "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--train-backend", "megatron",
        "--rollout-batch-size", "4", "--num-rollout", "2", *flags,
    ]  # fmt: skip
    res = normalize(argv=argv + (["--colocate"] if colocate else []))
    values = res.spec.to_dict()
    assert values["resource"] == resource
    assert res.derived["resource"] == resource
    defaults = {name: getattr(f, "default", None) for name, f in FIELDS.items()}
    assert unsupported_parameters(values, defaults) == []
    topology = plan_topology(
        values["resource"], colocate=colocate, with_rollout=True, device=GPU, train_world=resource["actor"][1]
    )
    assert topology.groups == groups
    assert compute_demand(res.spec).total_gpus == topology.num_bundles
    # given --resource, the legacy flags change nothing
    given = normalize(argv=argv + ["--resource", '{"actor": [1, 1], "rollout": [1, 1]}'])
    assert given.spec.to_dict()["resource"] == {"actor": [1, 1], "rollout": [1, 1]}
    assert "resource" not in given.derived
