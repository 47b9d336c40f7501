"""Parameter groups for the trainer: batching, parallelism, recompute, optimizer, precision, Megatron."""

from __future__ import annotations

from typing import Any

from jobspec.arguments import megatron
from jobspec.fields import ParamGroup, param

__all__ = [
    "BatchingParams",
    "ParallelismParams",
    "RecomputeParams",
    "OptimizerParams",
    "PrecisionParams",
    "MEGATRON_META",
]


class BatchingParams(ParamGroup):
    group = "batching"
    title = "Batching"

    global_batch_size = megatron(
        help="Global batch size: samples per parameter update (optimizer.step).",
        ge=1,
        unset="rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout when "
        "--num-steps-per-rollout is set",
    )
    micro_batch_size = megatron(help="Micro-batch size. Ignored with --use-dynamic-batch-size.", ge=1)
    num_steps_per_rollout: int | None = param(
        None,
        "Training steps per rollout; same as setting global-batch-size = rollout_batch_size * "
        "n_samples_per_prompt / num_steps_per_rollout.",
        ge=1,
    )
    use_dynamic_batch_size: bool = param(
        False,
        "Dynamic batching: pack samples by length so each micro-batch holds close to "
        "--max-tokens-per-gpu tokens.",
    )
    max_tokens_per_gpu: int | None = param(
        None,
        "Maximum tokens per GPU; required with dynamic batching. With context parallelism use about "
        "max_response_len / cp_size.",
        ge=1,
    )
    log_probs_max_tokens_per_gpu: int | None = param(
        None,
        "Maximum tokens per GPU when computing log-probs.",
        ge=1,
        unset="max_tokens_per_gpu",
    )
    balance_data: bool = param(
        False,
        "Balance token counts across data-parallel ranks with karmarkar_karp on the static / "
        "sequence-length balanced path. In fully-async mode with --use-dynamic-batch-size the dynamic "
        "path already balances tokens (StreamingTokenBudgetSampler), so the flag is accepted but changes "
        "nothing. Responses of one prompt may land in different training steps.",
    )


class ParallelismParams(ParamGroup):
    group = "parallelism"
    title = "Parallelism (Megatron)"

    tensor_model_parallel_size = megatron(help="Tensor parallel size.", ge=1)
    pipeline_model_parallel_size = megatron(help="Pipeline parallel size.", ge=1)
    sequence_parallel = megatron(help="Enable sequence parallelism.")
    context_parallel_size = megatron(help="Context parallel size.", ge=1)
    expert_model_parallel_size = megatron(help="Expert parallel size (MoE).", ge=1)
    expert_tensor_parallel_size = megatron(help="Expert tensor parallel size (MoE).", ge=1)


class RecomputeParams(ParamGroup):
    group = "recompute"
    title = "Recomputation (Megatron)"

    recompute_granularity = megatron(help="Activation recomputation granularity.", unset="no recomputation")
    recompute_method = megatron(help="Recomputation method (with granularity full).")
    recompute_num_layers = megatron(help="Number of layers to recompute (with --recompute-method).", ge=1)


class OptimizerParams(ParamGroup):
    group = "optimizer"
    title = "Optimizer"

    lr = megatron(help="Learning rate.", ge=0)
    optimizer = megatron(help="Optimizer (Megatron).")
    lr_decay_style = megatron(help="Learning-rate decay style (Megatron).")
    weight_decay = megatron(help="Weight decay (Megatron).", ge=0)
    adam_beta1 = megatron(help="Adam beta1 (Megatron).", ge=0, le=1)
    adam_beta2 = megatron(help="Adam beta2 (Megatron).", ge=0, le=1)
    clip_grad = megatron(help="Gradient clipping (max global norm).", ge=0)
    seed = megatron(help="Random seed.", ge=0)
    optimizer_cpu_offload = megatron(help="Offload optimizer state to CPU (Megatron).")
    overlap_cpu_optimizer_d2h_h2d = megatron(help="Overlap the CPU optimizer's D2H/H2D copies (Megatron).")
    use_precision_aware_optimizer = megatron(
        help="Use the precision-aware optimizer, which keeps master weights and optimizer state in the "
        "dtypes of --main-params-dtype, --exp-avg-dtype and --exp-avg-sq-dtype (Megatron)."
    )
    use_distributed_optimizer = megatron(help="Shard optimizer state ZeRO-1 style (Megatron).")
    overlap_grad_reduce = megatron(help="Overlap backward with the gradient reduce-scatter (Megatron).")
    overlap_param_gather = megatron(
        help="Overlap the reduce-scatter with the next step's parameter all-gather; needs "
        "--overlap-grad-reduce (Megatron)."
    )
    calculate_per_token_loss = megatron(help="Compute the loss per token (Megatron).")


class PrecisionParams(ParamGroup):
    group = "precision"
    title = "Precision and FP16 loss scaling (Megatron)"
    description = (
        "With dynamic FP16 loss scaling (--fp16 without --loss-scale) Relax fills unset options with "
        "historical compatibility values and warns: --initial-loss-scale 32768, --min-loss-scale 1, "
        "--use-precision-aware-optimizer on, where Megatron leaves them unset (at the Megatron commit Relax "
        "pins they all have defaults, so only what the optimizer keeps internally changes). With a static --loss-scale "
        "the two scales are not used (not defaulted, checked or warned about); the two boolean options "
        "still take their FP16 values. In dynamic mode both scales must be finite and > 0 and "
        "--min-loss-scale <= --initial-loss-scale."
    )

    bf16 = megatron(help="Train in bfloat16 (Megatron).")
    fp16 = megatron(help="Train in float16 with loss scaling (Megatron).")
    loss_scale = megatron(help="Static loss scale; unset means dynamic loss scaling (Megatron).", gt=0)
    initial_loss_scale = megatron(
        help="Initial scale of dynamic loss scaling (Megatron).",
        unset="32768 under dynamic --fp16 (Relax's FP16 fallback), else 2**32 (Megatron)",
    )
    min_loss_scale = megatron(
        help="Minimum scale of dynamic loss scaling (Megatron).",
        unset="1 (Relax's FP16 fallback and Megatron's default)",
    )
    loss_scale_window = megatron(
        help="Window over which the dynamic loss scale is raised or lowered (Megatron).", gt=0
    )
    hysteresis = megatron(help="Hysteresis of dynamic loss scaling (Megatron).", ge=1)
    accumulate_allreduce_grads_in_fp32 = megatron(
        help="Accumulate and all-reduce gradients in fp32 (Megatron)."
    )
    attention_softmax_in_fp32 = megatron(help="Run the attention softmax in fp32 (Megatron).")


#: Platform metadata (bounds, what an unset value means) for Megatron parameters that no reference
#: section documents; their type, default and help come from the generated table.
MEGATRON_META: dict[str, dict[str, Any]] = {
    "num_layers": dict(ge=1),
    "hidden_size": dict(ge=1),
    "ffn_hidden_size": dict(ge=1, unset="4 * hidden_size"),
    "num_attention_heads": dict(ge=1),
    "num_query_groups": dict(ge=1),
    "kv_channels": dict(ge=1, unset="hidden_size / num_attention_heads"),
    "seq_length": dict(ge=1, unset="4096 (Relax placeholder)"),
    "max_position_embeddings": dict(ge=1, unset="Relax sets it to --seq-length"),
    "norm_epsilon": dict(gt=0),
    "rotary_base": dict(ge=1),
    "rotary_percent": dict(gt=0, le=1),
    "vocab_size": dict(ge=1),
    "make_vocab_size_divisible_by": dict(ge=1),
    "attention_dropout": dict(ge=0, le=1),
    "hidden_dropout": dict(ge=0, le=1),
    "init_method_std": dict(ge=0),
    "num_layers_per_virtual_pipeline_stage": dict(ge=1),
    "lr_warmup_iters": dict(ge=0),
    "lr_warmup_fraction": dict(ge=0, le=1),
    "lr_decay_iters": dict(ge=1, unset="the training length"),
    "min_lr": dict(ge=0),
    "adam_eps": dict(gt=0),
    "sgd_momentum": dict(ge=0),
    "num_experts": dict(ge=1),
    "moe_router_topk": dict(ge=1),
    "moe_ffn_hidden_size": dict(ge=1),
    "moe_shared_expert_intermediate_size": dict(ge=1),
    "moe_aux_loss_coeff": dict(ge=0),
}
