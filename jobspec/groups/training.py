"""Parameter groups for the trainer: batching, parallelism, recompute, optimizer, precision, Megatron."""

from __future__ import annotations

from typing import Literal

from jobspec.fields import ParamGroup, param

__all__ = [
    "BatchingParams",
    "ParallelismParams",
    "RecomputeParams",
    "OptimizerParams",
    "PrecisionParams",
    "MegatronParams",
]


class BatchingParams(ParamGroup):
    group = "batching"
    title = "Batching"

    global_batch_size: int | None = param(
        None,
        "Global batch size: samples per parameter update (optimizer.step).",
        ge=1,
        origin="megatron",
        unset="rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout when "
        "--num-steps-per-rollout is set",
    )
    micro_batch_size: int = param(
        1, "Micro-batch size. Ignored with --use-dynamic-batch-size.", ge=1, origin="megatron"
    )
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

    tensor_model_parallel_size: int = param(1, "Tensor parallel size.", ge=1, origin="megatron")
    pipeline_model_parallel_size: int = param(1, "Pipeline parallel size.", ge=1, origin="megatron")
    sequence_parallel: bool = param(False, "Enable sequence parallelism.", origin="megatron")
    context_parallel_size: int = param(1, "Context parallel size.", ge=1, origin="megatron")
    expert_model_parallel_size: int = param(1, "Expert parallel size (MoE).", ge=1, origin="megatron")
    expert_tensor_parallel_size: int = param(1, "Expert tensor parallel size (MoE).", ge=1, origin="megatron")


class RecomputeParams(ParamGroup):
    group = "recompute"
    title = "Recomputation (Megatron)"

    recompute_granularity: Literal["full", "selective"] | None = param(
        None, "Activation recomputation granularity.", origin="megatron", unset="no recomputation"
    )
    recompute_method: Literal["uniform", "block"] | None = param(
        None, "Recomputation method (with granularity full).", origin="megatron"
    )
    recompute_num_layers: int | None = param(
        None, "Number of layers to recompute (with --recompute-method).", ge=1, origin="megatron"
    )


class OptimizerParams(ParamGroup):
    group = "optimizer"
    title = "Optimizer"

    lr: float = param(1e-6, "Learning rate.", ge=0, origin="megatron")
    optimizer: Literal["adam", "sgd"] = param("adam", "Optimizer (Megatron).", origin="megatron")
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = param(
        "linear", "Learning-rate decay style (Megatron).", origin="megatron"
    )
    weight_decay: float = param(0.01, "Weight decay (Megatron).", ge=0, origin="megatron")
    adam_beta1: float = param(0.9, "Adam beta1 (Megatron).", ge=0, le=1, origin="megatron")
    adam_beta2: float = param(0.999, "Adam beta2 (Megatron).", ge=0, le=1, origin="megatron")
    clip_grad: float = param(1.0, "Gradient clipping (max global norm).", ge=0, origin="megatron")
    seed: int = param(1234, "Random seed.", ge=0, origin="megatron")
    optimizer_cpu_offload: bool = param(
        False, "Offload optimizer state to CPU (Megatron).", origin="megatron"
    )
    overlap_cpu_optimizer_d2h_h2d: bool = param(
        False, "Overlap the CPU optimizer's D2H/H2D copies (Megatron).", origin="megatron"
    )
    use_precision_aware_optimizer: bool | None = param(
        None,
        "Use TransformerEngine's precision-aware optimizer (Megatron); --no-use-precision-aware-optimizer "
        "turns it off.",
        kind="negatable",
        origin="megatron",
        unset="on under --fp16 (Relax's FP16 fallback), else off (Megatron)",
    )
    use_distributed_optimizer: bool = param(
        False, "Shard optimizer state ZeRO-1 style (Megatron).", origin="megatron"
    )
    overlap_grad_reduce: bool = param(
        False, "Overlap backward with the gradient reduce-scatter (Megatron).", origin="megatron"
    )
    overlap_param_gather: bool = param(
        False,
        "Overlap the reduce-scatter with the next step's parameter all-gather; needs "
        "--overlap-grad-reduce (Megatron).",
        origin="megatron",
    )
    calculate_per_token_loss: bool = param(False, "Compute the loss per token (Megatron).", origin="megatron")


class PrecisionParams(ParamGroup):
    group = "precision"
    title = "Precision and FP16 loss scaling (Megatron)"
    description = (
        "With dynamic FP16 loss scaling (--fp16 without --loss-scale) Relax fills unset options with "
        "historical compatibility values and warns: --initial-loss-scale 32768, --min-loss-scale 1, "
        "--use-precision-aware-optimizer on, --store-param-remainders off. With a static --loss-scale "
        "the two scales are not used (not defaulted, checked or warned about); the two boolean options "
        "still take their FP16 values. In dynamic mode both scales must be finite and > 0 and "
        "--min-loss-scale <= --initial-loss-scale."
    )

    bf16: bool = param(False, "Train in bfloat16 (Megatron).", origin="megatron")
    fp16: bool = param(False, "Train in float16 with loss scaling (Megatron).", origin="megatron")
    loss_scale: float | None = param(
        None, "Static loss scale; unset means dynamic loss scaling (Megatron).", gt=0, origin="megatron"
    )
    initial_loss_scale: float | None = param(
        None,
        "Initial scale of dynamic loss scaling (Megatron).",
        origin="megatron",
        unset="32768 under dynamic --fp16 (Relax's FP16 fallback), else 2**32 (Megatron)",
    )
    min_loss_scale: float | None = param(
        None,
        "Minimum scale of dynamic loss scaling (Megatron).",
        origin="megatron",
        unset="1 (Relax's FP16 fallback and Megatron's default)",
    )
    loss_scale_window: float = param(
        1000.0,
        "Window over which the dynamic loss scale is raised or lowered (Megatron).",
        gt=0,
        origin="megatron",
    )
    hysteresis: int = param(2, "Hysteresis of dynamic loss scaling (Megatron).", ge=1, origin="megatron")
    store_param_remainders: bool | None = param(
        None,
        "Let the distributed optimizer store parameter remainders instead of full fp32 master weights "
        "(Megatron); --no-store-param-remainders turns it off.",
        kind="negatable",
        origin="megatron",
        unset="off under --fp16 (Relax's FP16 fallback), else on (Megatron)",
    )
    accumulate_allreduce_grads_in_fp32: bool = param(
        False, "Accumulate and all-reduce gradients in fp32 (Megatron).", origin="megatron"
    )
    attention_softmax_in_fp32: bool = param(
        False, "Run the attention softmax in fp32 (Megatron).", origin="megatron"
    )


class MegatronParams(ParamGroup):
    group = "megatron"
    title = "Megatron passthrough (model shape, schedule, MoE, kernels)"
    description = (
        "Relax hands every Megatron-LM flag to Megatron. Relax Platform models an explicit list of them: "
        "the ones in the reference (parallelism, recomputation, optimizer, precision, micro/global batch "
        "size, checkpoint options) plus the model-shape, schedule, MoE and kernel flags below. Any other "
        "Megatron flag is refused as an unknown key; add it here (with its type, default and help) to "
        "accept it."
    )

    num_layers: int | None = param(None, "Number of transformer layers.", ge=1, origin="megatron")
    hidden_size: int | None = param(None, "Transformer hidden size.", ge=1, origin="megatron")
    ffn_hidden_size: int | None = param(
        None, "Hidden size of the MLP.", ge=1, origin="megatron", unset="4 * hidden_size"
    )
    num_attention_heads: int | None = param(None, "Number of attention heads.", ge=1, origin="megatron")
    num_query_groups: int | None = param(
        None, "Number of query groups (key/value heads) for grouped-query attention.", ge=1, origin="megatron"
    )
    group_query_attention: bool = param(False, "Use grouped-query attention.", origin="megatron")
    kv_channels: int | None = param(
        None,
        "Projection size per attention head.",
        ge=1,
        origin="megatron",
        unset="hidden_size / num_attention_heads",
    )
    seq_length: int | None = param(
        None, "Maximum sequence length to process.", ge=1, origin="megatron", unset="4096 (Relax placeholder)"
    )
    max_position_embeddings: int | None = param(
        None,
        "Maximum number of position embeddings.",
        ge=1,
        origin="megatron",
        unset="Relax sets it to --seq-length",
    )
    swiglu: bool = param(False, "Use the SwiGLU activation.", origin="megatron")
    normalization: Literal["LayerNorm", "RMSNorm"] = param(
        "LayerNorm", "Normalization layer type.", origin="megatron"
    )
    norm_epsilon: float = param(1e-5, "Epsilon of the normalization layers.", gt=0, origin="megatron")
    position_embedding_type: Literal["learned_absolute", "rope", "mrope", "relative", "none"] = param(
        "learned_absolute", "Position embedding type.", origin="megatron"
    )
    rotary_base: int = param(10000, "Base period of rotary position embeddings.", ge=1, origin="megatron")
    rotary_percent: float = param(
        1.0, "Fraction of the head dimension that gets rotary embeddings.", gt=0, le=1, origin="megatron"
    )
    untie_embeddings_and_output_weights: bool = param(
        False, "Untie the input embedding and output layer weights.", origin="megatron"
    )
    vocab_size: int | None = param(None, "Vocabulary size before padding.", ge=1, origin="megatron")
    make_vocab_size_divisible_by: int = param(
        128, "Pad the vocabulary so its size is divisible by this value.", ge=1, origin="megatron"
    )
    disable_bias_linear: bool = param(False, "Drop the bias of linear layers.", origin="megatron")
    add_qkv_bias: bool = param(False, "Add a bias to the QKV projection only.", origin="megatron")
    qk_layernorm: bool = param(False, "Normalize queries and keys.", origin="megatron")
    attention_dropout: float = param(0.1, "Attention dropout probability.", ge=0, le=1, origin="megatron")
    hidden_dropout: float = param(0.1, "Hidden-state dropout probability.", ge=0, le=1, origin="megatron")
    init_method_std: float = param(0.02, "Std of the weight initialisation.", ge=0, origin="megatron")
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] = param(
        "auto", "Attention kernel backend.", origin="megatron"
    )
    transformer_impl: Literal["local", "transformer_engine"] = param(
        "transformer_engine", "Transformer implementation.", origin="megatron"
    )
    num_layers_per_virtual_pipeline_stage: int | None = param(
        None, "Layers per virtual pipeline stage (interleaved schedule, VPP).", ge=1, origin="megatron"
    )
    recompute_modules: list[str] | None = param(
        None,
        "Modules to recompute with --recompute-granularity selective (e.g. core_attn mlp).",
        min_length=1,
        origin="megatron",
    )
    lr_warmup_iters: int = param(0, "Linear learning-rate warm-up iterations.", ge=0, origin="megatron")
    lr_warmup_fraction: float | None = param(
        None, "Warm-up as a fraction of the decay iterations.", ge=0, le=1, origin="megatron"
    )
    lr_decay_iters: int | None = param(
        None,
        "Iterations over which the learning rate decays.",
        ge=1,
        origin="megatron",
        unset="the training length",
    )
    min_lr: float = param(0.0, "Minimum learning rate of the decay schedule.", ge=0, origin="megatron")
    adam_eps: float = param(1e-8, "Adam epsilon.", gt=0, origin="megatron")
    sgd_momentum: float = param(0.9, "SGD momentum.", ge=0, origin="megatron")
    no_load_optim: bool = param(False, "Do not load optimizer state from the checkpoint.", origin="megatron")
    no_load_rng: bool = param(False, "Do not load RNG state from the checkpoint.", origin="megatron")
    finetune: bool = param(
        False, "Load weights only and reset the iteration counter (fine-tuning).", origin="megatron"
    )
    ckpt_format: Literal["torch", "torch_dist", "zarr"] = param(
        "torch_dist", "Checkpoint format.", origin="megatron"
    )
    num_experts: int | None = param(
        None, "Number of MoE experts (unset = dense model).", ge=1, origin="megatron"
    )
    moe_router_topk: int = param(2, "Experts each token is routed to.", ge=1, origin="megatron")
    moe_ffn_hidden_size: int | None = param(
        None, "Hidden size of each expert's MLP.", ge=1, origin="megatron"
    )
    moe_shared_expert_intermediate_size: int | None = param(
        None, "Hidden size of the shared experts.", ge=1, origin="megatron"
    )
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = param(
        "aux_loss", "MoE router load-balancing strategy.", origin="megatron"
    )
    moe_aux_loss_coeff: float = param(0.0, "MoE auxiliary loss coefficient.", ge=0, origin="megatron")
    moe_router_score_function: Literal["softmax", "sigmoid"] = param(
        "softmax", "MoE router score function.", origin="megatron"
    )
    moe_router_pre_softmax: bool = param(False, "Apply softmax before top-k selection.", origin="megatron")
    moe_grouped_gemm: bool = param(False, "Use grouped GEMM for the experts.", origin="megatron")
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = param(
        "allgather", "MoE token dispatcher.", origin="megatron"
    )
    moe_permute_fusion: bool = param(False, "Fuse the MoE token permutation.", origin="megatron")
