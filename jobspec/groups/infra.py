"""Parameter groups for the cluster: resources, TransferQueue, training backend/mode, checkpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from jobspec.arguments import megatron
from jobspec.bounds import MAX_DEMAND_GPUS
from jobspec.fields import ParamGroup, param

__all__ = ["ClusterParams", "TransferQueueParams", "BackendParams", "CheckpointParams"]

#: role -> [replicas, gpus]; Relax reads `gpus` as the role's total GPU count.
ResourceMap = dict[
    str, Annotated[list[Annotated[int, Field(ge=0, le=MAX_DEMAND_GPUS)]], Field(min_length=2, max_length=2)]
]


class ClusterParams(ParamGroup):
    group = "cluster"
    title = "Cluster and resources (Ray launch)"

    rollout_num_gpus_per_engine: int = param(
        1, "GPUs per SGLang inference engine; equivalent to SGLang's tp_size.", ge=1
    )
    num_gpus_per_node: int = param(
        8,
        "GPUs per node. Set it when a node offers fewer than 8 GPUs (notably in colocate mode).",
        ge=1,
    )
    resource: ResourceMap | None = param(
        None,
        'Ray resources per role as JSON: \'{"actor": [replicas, gpus], "rollout": [replicas, gpus]}\'. '
        "Relax reads the second number as the role's total GPU count (0 = CPU-only role). Roles: actor, "
        "rollout, reference, actor_fwd, advantages, critic, genrm, teacher, sft.",
    )
    colocate: bool = param(
        False,
        "Colocate the inference engines and the training actor on the same GPUs. Turning it on also "
        "turns on offloading (--offload-train and --offload-rollout default to true).",
    )
    offload: bool = param(False, "Equivalent to setting both --offload-train and --offload-rollout.")
    offload_train: bool | None = param(
        None,
        "Offload the training actor to CPU while it is not training. Always true with --colocate.",
        kind="negatable",
        unset="true with --colocate or --offload (and for PPO), else false",
    )
    offload_rollout: bool | None = param(
        None,
        "Offload the rollout engines to CPU during training. Always true with --colocate.",
        kind="negatable",
        unset="true with --colocate or --offload, else false",
    )
    distributed_backend = megatron(help="Distributed backend (Megatron).")
    distributed_timeout_minutes = megatron(help="Distributed timeout in minutes (Megatron).", ge=1)


class TransferQueueParams(ParamGroup):
    group = "transfer_queue"
    title = "TransferQueue data queue"

    num_data_storage_units: int = param(1, "Number of TransferQueue SimpleStorageUnit actors.", ge=1)
    per_rank_fetch: bool = param(
        False,
        "Let every TP/PP rank pull its own copy of the batch from TransferQueue in parallel, saving the "
        "rank-0 pickle and TP/PP broadcast. Cross-rank consistency relies on the TQ sampler cache keyed by "
        "(partition_id, task_name, dp_rank, batch_index). Disabled automatically when rollout_routed_experts "
        "is among the data fields. Best with --num-data-storage-units >= TP world size; pays off when "
        "pickling dominates the TP broadcast time.",
    )
    max_staleness: int = param(0, "Maximum staleness of TransferQueue data (0 = on-policy).", ge=0)
    polling_mode: bool = param(
        True,
        "Use polling when fetching metadata. Relax declares it with argparse type=bool, so on the command "
        "line any non-empty value means true and only an empty value ('--polling-mode=') means false.",
        kind="bool_value",
    )
    num_iters_per_train_update: int = param(
        1, "Iterations per global batch in the fully-async pipeline.", ge=1
    )


class BackendParams(ParamGroup):
    group = "backend"
    title = "Training backend and mode"

    train_backend: Literal["megatron", "torch"] = param(
        "megatron",
        "Training backend. 'megatron' is Relax's backend; 'torch' (Hugging Face model, runs on CPU) is a "
        "Relax Platform extension that the original launcher does not accept.",
    )
    qkv_format: Literal["thd", "bshd"] = param(
        "thd",
        "QKV layout for the Megatron backend. bshd does not support dynamic batching and needs "
        "--micro-batch-size.",
    )
    megatron_to_hf_mode: Literal["raw", "bridge"] = param(
        "raw",
        "How Megatron weights are converted to Hugging Face weights. 'bridge' converts automatically "
        "with Megatron Bridge.",
    )
    true_on_policy_mode: bool = param(
        False,
        "Enable true on-policy mode: skip the actor_fwd role and reuse the training forward's log-probs. "
        "Turned on automatically with --fully-async when rollout_batch_size * n_samples_per_prompt == "
        "global_batch_size.",
    )
    fully_async: bool = param(False, "Use the fully asynchronous training pipeline.")
    hybrid: bool = param(
        False,
        "Hybrid mode (from Relax's arguments.py, not in the reference tables): the fully-async streaming "
        "pipeline with colocate-style weight sharing; actor, reference, actor_fwd and advantages share the "
        "actor GPUs and rollout runs on its own GPUs. Set automatically when --fully-async and --colocate "
        "are combined.",
    )


class CheckpointParams(ParamGroup):
    group = "checkpoint"
    title = "Checkpoints"

    hf_checkpoint: str | None = param(
        None,
        "Hugging Face checkpoint path. Initialises SGLang and provides the tokenizer; it need not hold the "
        "latest weights, only the same architecture as the trained model.",
        path_kind="input",
    )
    ref_load: str | None = param(
        None,
        "Reference model checkpoint path. Also the initial training checkpoint when --load is not set.",
        path_kind="input",
    )
    ref_ckpt_step: int | None = param(None, "Step of the reference model checkpoint to load.", ge=0)
    load = megatron(
        help="Actor checkpoint path to load; point it at the save directory to resume.", path_kind="input"
    )
    save = megatron(help="Directory the model is saved to during training.", path_kind="output")
    save_interval = megatron(help="Save interval in steps.", ge=1)
    save_hf: str | None = param(
        None,
        "Path to save a Hugging Face format model (Megatron backend). May contain a {rollout_id} placeholder.",
        path_kind="output",
    )
    async_save = megatron(help="Save checkpoints asynchronously.")
    no_save_optim = megatron(
        help="Do not save optimizer state in checkpoints: smaller checkpoints, but training cannot resume "
        "from them."
    )
    rotate_ckpt: bool = param(False, "Rotate checkpoints. Needs --save, --save-interval and --async-save.")
    max_actor_ckpt_to_keep: int | None = param(None, "Maximum number of actor checkpoints to keep.", ge=1)
    checkpoint_engine_backend: str = param("nccl", "Checkpoint engine backend.")
