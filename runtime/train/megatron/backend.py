"""The `megatron` training backend: megatron-core behind the `TrainBackend` seam (docs/adr/0006).

One instance per rank, in its own Ray actor (`TrainActor`); every method is called on every rank with the
same arguments (SPMD) and only rank 0's answer reaches the driver. A batch arrives whole on every rank; each
rank takes its data-parallel share of each optimizer step's rows, the pipeline stages of one replica see the
same share.

- model: `model.model_args_for(values, hf_checkpoint)` -> `build_model` (one `GPTModel` per virtual
  pipeline chunk), weights from `ref-load` (a Hugging Face folder or a checkpoint root of this backend)
  else `hf-checkpoint` (`convert.load_hf_checkpoint`); megatron's `DistributedDataParallel` around each
  chunk (`overlap-grad-reduce`, `overlap-param-gather`), Megatron's optimizer (Adam, distributed optimizer
  as Relax always uses it, `clip-grad`, `optimizer-cpu-offload`).
- the update: `get_forward_backward_func()` (pipeline schedules included) over micro-batches of
  `micro-batch-size` rows or `max-tokens-per-gpu` tokens (`use-dynamic-batch-size`); each micro-batch's
  loss is `runtime.algos.losses` over log-probs and entropy from `kernels.token_log_probs_and_entropy`
  (the vocab-parallel chunked loss head), weighted exactly as the torch backend weights it; the lr follows
  `runtime.train.schedule` per optimizer step.
- weights out: `convert.gather_hf_state` (Hugging Face names on rank 0) for weight sync and exports.
- checkpoints: `checkpoint.py` (torch_dist in Relax's `iter_NNNNNNN/` layout).
- on CUDA, the fast path `bench/gpu_train.py` measured (docs/benchmarks.md): bf16/fp16 weights through
  megatron's `Float16Module` (the spec's `bf16`, which Relax derives on this backend), the last stage's hidden
  states handed to the loss head in that precision (no fp32 round trip), every `TransformerLayer`
  torch.compile'd (`kernels.compile_transformer_layers`; dense models only), megatron's compiled SwiGLU and
  bias-dropout-add (`model.transformer_config`), and the loss head keeping each chunk's logits for backward
  (`save_logits`) when they fit (`_head_save_budget`). None of it applies on CPU.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.algos.freezing import select_trainable_parameters
from runtime.algos.losses import resolve_loss_fn
from runtime.devices import Device
from runtime.train import checkpoint as relax_checkpoint
from runtime.train.base import TRAIN_BACKENDS, TrainBackendName, TrainContext
from runtime.train.checkpoint import CheckpointFormat, CheckpointRecord, atomic_directory, record
from runtime.train.megatron import checkpoint as ckpt
from runtime.train.megatron.convert import (
    gather_hf_state,
    iter_stage_hf_state,
    load_hf_checkpoint,
    unwrap,
    write_hf_folder,
)
from runtime.train.megatron.cpu import install_cpu_shims
from runtime.train.megatron.kernels import compile_transformer_layers, fuse_adam, token_log_probs_and_entropy
from runtime.train.megatron.model import build_model, model_args_for, transformer_config
from runtime.train.megatron.parallel import (
    ParallelLayout,
    cp_packed_columns,
    cp_sequence_order,
    init_process_group,
    initialize_parallel,
)
from runtime.train.torch_backend import (
    TrainConfig,
    fill_log_probs,
    micro_batch_weight,
    micro_batches,
    policy_loss_inputs,
)
from runtime.types import RolloutBatch, split_evenly

log = logging.getLogger(__name__)

DEFAULT_CHUNK_TOKENS = 4096  # tokens per chunk of the loss head when `log-probs-chunk-size` is unset (-1)
# `RELAX_HEAD_SAVE_LOGITS`: 1 = the loss head always keeps its chunk logits for backward, 0 = never (recompute
# them), unset / auto = when they fit (`MegatronTrainBackend._head_save_budget`; never on CPU)
HEAD_SAVE_LOGITS_ENV = "RELAX_HEAD_SAVE_LOGITS"
COMPILE_BACKEND_ENV = "RELAX_KERNELS_COMPILE_BACKEND"  # compile the layers with this backend anywhere (tests)
# `RELAX_HEAD_ALL_POSITIONS=1`: the loss head over every fed position, not only those carrying loss (the
# behaviour before `_Micro.loss_positions`; for measuring the difference)
HEAD_ALL_POSITIONS_ENV = "RELAX_HEAD_ALL_POSITIONS"


@dataclass
class _Micro:
    """One micro-batch as the model sees it (`tokens`, `positions`, and for packed sequences `seqlens`) and how
    its per-position outputs map back onto `batch`, the real rows (`targets`, `index`).

    `--qkv-format bshd`: `tokens` are the rows, right-padded to the schedule's shape `[rows, width]`.
    `--qkv-format thd` (Relax's default): `tokens` are `[1, t]`, the rows' real tokens end to end, each sequence
    padded to a multiple of `2 x cp` under context parallelism (`seqlens`, padding included), with a trailing
    padding sequence where the schedule needs a longer or rounder pack; positions restart at each sequence."""

    batch: RolloutBatch
    tokens: torch.Tensor  # [b, s] what the model is fed
    positions: torch.Tensor  # [b, s]
    targets: torch.Tensor  # [b, s] the token each position predicts (0 where there is none)
    index: torch.Tensor  # [rows, width] flat position ([b * s], row-major) predicting token (i, j), or -1
    seqlens: list[int] | None = None  # thd: the pack's sequence lengths; None: bshd
    weight: float = 0.0  # its share of the optimizer step's loss (the torch backend's weighting)

    @property
    def packed(self) -> bool:
        return self.seqlens is not None

    @property
    def sequences(self) -> tuple[int, ...]:
        """The sequences along the fed axis: the pack's (thd), or one of the padded width (bshd)."""
        return tuple(self.seqlens) if self.seqlens is not None else (int(self.tokens.shape[1]),)

    def columns(self, cp: int, rank: int) -> torch.Tensor:
        """The positions of the fed sequence axis that context-parallel rank `rank` holds, in its order."""
        return cp_packed_columns(self.sequences, cp, rank)

    def packed_seq_params(self, device: torch.device) -> Any:
        """megatron's `PackedSeqParams` for the pack (the whole pack's `cu_seqlens`, also under CP)."""
        from megatron.core.packed_seq_params import PackedSeqParams

        assert self.seqlens is not None
        cu = to_device(
            torch.tensor([0, *self.seqlens], dtype=torch.int32).cumsum(0, dtype=torch.int32), device
        )
        longest = max(self.seqlens)
        return PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
        )

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position values `[s, b]` (sequence first, as megatron's outputs) -> `[rows, width]` aligned with
        the batch's tokens: column j holds what position j - 1 predicted (column 0 and padding are 0)."""
        flat = values.t().reshape(-1)
        index = to_device(self.index, flat.device)
        picked = flat[index.clamp(min=0)]
        return torch.where(index >= 0, picked, torch.zeros_like(picked)).float()

    def loss_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions that carry loss: (their flat fed positions, `[b * s]` row-major as `index`, and their
        flat places `[rows * width]` in the batch's rows), for the tokens `batch.loss_mask` marks (the first
        column predicts nothing and is never one)."""
        mask = (self.batch.loss_mask > 0) & (self.index >= 0)
        return self.index[mask], mask.reshape(-1).nonzero().squeeze(1)

    def at_loss_positions(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-position values `[s, b, ...]` (sequence first, as megatron's outputs) -> (those of the positions
        that carry loss `[n, ...]`, the tokens they predict `[n]`, their flat places in the rows `[n]`, for
        `spread`); n may be 0."""
        fed, places = self.loss_positions()
        device = hidden.device
        s, b = int(hidden.shape[0]), int(hidden.shape[1])
        fed = to_device(fed, device)
        rows = (fed % s) * b + torch.div(fed, s, rounding_mode="floor")  # `fed` is [b, s] row-major
        states = hidden.reshape(s * b, *hidden.shape[2:]).index_select(0, rows)
        targets = to_device(self.targets, device).reshape(-1).index_select(0, fed)
        return states, targets, to_device(places, device)

    def spread(self, values: torch.Tensor, places: torch.Tensor) -> torch.Tensor:
        """Values of the loss positions `[n]` (`at_loss_positions`) -> `[rows, width]` fp32, 0 elsewhere."""
        rows, width = (int(n) for n in self.index.shape)
        out = torch.zeros(rows * width, dtype=torch.float32, device=values.device)
        return out.index_put((places,), values.float()).view(rows, width)


def padded_micro(part: RolloutBatch, rows: int, width: int) -> _Micro:
    """`part`'s rows right-padded to `[rows, width]` (`bshd`)."""
    tokens = torch.zeros((rows, width), dtype=torch.long)
    tokens[: part.batch_size, : part.tokens.shape[1]] = part.tokens
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    real_rows, real_width = part.batch_size, int(part.tokens.shape[1])
    index = torch.arange(real_rows).unsqueeze(1) * width + torch.arange(real_width).unsqueeze(0) - 1
    index[:, 0] = -1
    positions = torch.arange(width).unsqueeze(0).expand(rows, width)
    return _Micro(part, tokens, positions, targets, index)


def row_lengths(part: RolloutBatch) -> list[int]:
    """Each row's length: up to its last real token (rows are right-padded)."""
    mask = part.attention_mask.bool()
    cols = torch.arange(mask.shape[1]).unsqueeze(0).expand_as(mask)
    return [max(1, int(n)) for n in torch.where(mask, cols + 1, torch.zeros_like(cols)).max(dim=1).values]


def _pack_layout(
    part: RolloutBatch, multiple: int, total_multiple: int, total: int = 0
) -> tuple[list[int], list[int]]:
    """(each row's real length, the pack's sequence lengths) of `packed_micro(part, multiple, total_multiple,
    total)`: each row padded to a multiple of `multiple`, then a padding sequence up to `total` and a multiple
    of `total_multiple`."""
    lengths = row_lengths(part)
    seqlens = [-(-n // multiple) * multiple for n in lengths]
    used = sum(seqlens)
    size = -(-max(used, total) // total_multiple) * total_multiple
    if size > used:
        seqlens.append(size - used)
    return lengths, seqlens


def packed_length(part: RolloutBatch, multiple: int, total_multiple: int) -> int:
    """The pack `packed_micro(part, multiple, total_multiple)` builds, in tokens."""
    return sum(_pack_layout(part, multiple, total_multiple)[1])


def packed_micro(part: RolloutBatch, multiple: int, total_multiple: int, total: int = 0) -> _Micro:
    """`part`'s rows packed end to end (`thd`): each row's real tokens padded to a multiple of `multiple` (2 x cp
    under context parallelism), then a padding sequence up to `total` (the schedule's uniform length) and a
    multiple of `total_multiple` (which `multiple` divides)."""
    lengths, seqlens = _pack_layout(part, multiple, total_multiple, total)
    size = sum(seqlens)
    tokens = torch.zeros((1, size), dtype=torch.long)
    targets = torch.zeros_like(tokens)
    positions = torch.zeros_like(tokens)
    width = int(part.tokens.shape[1])
    index = torch.full((part.batch_size, width), -1, dtype=torch.long)
    start = 0
    for row, (n, slot) in enumerate(zip(lengths + [0], seqlens, strict=False)):
        positions[0, start : start + slot] = torch.arange(slot)
        if row < part.batch_size:
            tokens[0, start : start + n] = part.tokens[row, :n]
            targets[0, start : start + n - 1] = part.tokens[row, 1:n]
            index[row, 1:n] = torch.arange(start, start + n - 1)
        start += slot
    return _Micro(part, tokens, positions, targets, index, seqlens=seqlens)


def _get(values: Mapping[str, Any], name: str, default: Any) -> Any:
    value = values.get(name)
    return default if value is None else value


def balanced_rows(tokens: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """`balance-data`: rows shared out in parts of the given sizes with token counts as even as a greedy
    pass makes them: the longest rows first, each to the part with the fewest tokens that still has room.
    Each part's rows stay in batch order."""
    parts: list[list[int]] = [[] for _ in sizes]
    load = [0] * len(sizes)
    for row in sorted(range(len(tokens)), key=lambda r: (-int(tokens[r]), r)):
        open_parts = [p for p in range(len(sizes)) if len(parts[p]) < sizes[p]]
        target = min(open_parts, key=lambda p: (load[p], p))
        parts[target].append(row)
        load[target] += int(tokens[row])
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in parts]


class MegatronModelRunner:
    """What the policy trainer and PPO's critic (`runtime.train.megatron.critic`) share, one instance per
    rank (SPMD): the process group and megatron's parallel state, model chunks built and loaded, megatron's
    DDP and distributed optimizer, data-parallel shares and micro-batches, the forward/backward schedule over
    them (`_run`, `_train`, `_per_token`), offload, and torch_dist checkpoints of model + optimizer + RNG. A
    subclass brings its head (the function `_forward_step` hands the last stage's hidden states to) and its
    loss. `config` is the role's (`TrainConfig`, or the critic's `CriticConfig`): the optimizer and batching
    fields they have in common."""

    config: Any
    models: list
    ddp_models: list
    optimizer: Any
    ddp_config: Any

    def _start(self, hf_checkpoint: str, config: Any, device: Device, context: TrainContext) -> None:
        """This rank's process group (unless the process already has one), megatron's parallel state in the
        layout the spec's values ask for, and the model's architecture and `TransformerConfig`."""
        from megatron.core import parallel_state as ps

        self.config = config
        self.device = device
        self.hf_checkpoint = hf_checkpoint
        self.values: dict[str, Any] = dict(context.values)
        self.rank = context.rank
        self.on_cpu = install_cpu_shims()
        if not dist.is_initialized():
            if context.master_port is None:
                raise ValueError("the megatron backend needs the rendezvous port (TrainContext.master_port)")
            init_process_group(
                context.rank,
                context.world_size,
                context.master_addr,
                int(context.master_port),
                timeout_minutes=int(_get(self.values, "distributed_timeout_minutes", 10)),
            )
        self.args = model_args_for(self.values, hf_checkpoint)
        self.layout = ParallelLayout.from_values(
            self.values, context.world_size, num_layers=self.args.num_layers
        )
        initialize_parallel(self.layout, config.seed)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        self.is_last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.cp_rank = ps.get_context_parallel_rank()
        self.cp_group = ps.get_context_parallel_group() if self.layout.cp > 1 else None
        self.model_config = transformer_config(self.args, self.layout, values=self.values)
        self.optimizer_steps = 0
        self.offloaded = False
        self._offloaded_storage: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
        self._pending_saves: list[ckpt.PendingSave] = []

    # -- construction ------------------------------------------------------------------------------------------
    def _initial_step(self) -> int | None:
        """Which iteration `_build_and_load` reads from a checkpoint root (None: the latest)."""
        return None

    def _build_and_load(self, source: tuple[str, str], *, iteration: int | None = None) -> list:
        """Model chunks with weights from `source` (kind, path); a checkpoint root is read at `iteration`, else
        at `_initial_step()`, else its latest."""
        models = build_model(self.args, self.layout, self.model_config)
        if self.model_config.bf16 or self.model_config.fp16:
            from megatron.core.transformer.module import Float16Module

            models = [Float16Module(self.model_config, m) for m in models]
        kind, path = source
        if kind == "random":
            pass  # megatron's initialisation (perform_initialization, init-method-std), seeded per rank
        elif kind == "hf":
            load_hf_checkpoint([unwrap(m) for m in models], path, self.args, self.layout)
        else:
            step = iteration if iteration is not None else self._initial_step()
            iteration = step if step is not None else relax_checkpoint.read_latest_iteration(path)
            folder = relax_checkpoint.iteration_dir(path, int(iteration))  # type: ignore[arg-type]
            gpts = [unwrap(m) for m in models]
            loaded = ckpt.load(folder, ckpt.model_sharded_state(gpts))
            for i, gpt in enumerate(gpts):
                gpt.load_state_dict(loaded[ckpt.chunk_key(i, len(gpts))], strict=False)
        return models

    def _compile_layers(self, models: list) -> int:
        """torch.compile every `TransformerLayer` of `models` on CUDA (`kernels.compile_transformer_layers`: not
        on CPU, not with `RELAX_KERNELS_COMPILE=0`); measured on the H200 at Qwen2 shapes: 41.6% -> 45.7% MFU
        (docs/benchmarks.md). Dense models only: an MoE layer's token routing gives every step new expert
        shapes (recompiles), which was not measured. `RELAX_KERNELS_COMPILE_BACKEND=<torch.compile backend>`
        compiles them with that backend on any device (tests trace the CUDA path's graphs on CPU with `eager`
        or `aot_eager`). Returns the number of layers compiled."""
        if self.args.is_moe:
            return 0
        forced = os.environ.get(COMPILE_BACKEND_ENV)
        if forced:
            return sum(compile_transformer_layers(model, backend=forced) for model in models)
        if self.on_cpu:
            return 0
        return sum(compile_transformer_layers(model) for model in models)

    def _wrap_ddp(self, models: list) -> list:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=bool(_get(self.values, "accumulate_allreduce_grads_in_fp32", False)),
            overlap_grad_reduce=bool(_get(self.values, "overlap_grad_reduce", False)),
            overlap_param_gather=bool(_get(self.values, "overlap_param_gather", False)),
            use_distributed_optimizer=True,
            # off under dynamic fp16 loss scaling, where an inf/NaN gradient is the loss scaler's signal to
            # skip the step and lower the scale (as Megatron-LM's validate_args turns it off)
            check_for_nan_in_grad=bool(_get(self.values, "check_for_nan_in_loss_and_grad", False))
            and not (self.values.get("fp16") and self.values.get("loss_scale") is None),
            bucket_size=self.values.get("ddp_bucket_size"),
            average_in_collective=bool(_get(self.values, "ddp_average_in_collective", False)),
        )
        self.ddp_config = ddp_config
        return [
            DistributedDataParallel(self.model_config, ddp_config, m, disable_bucketing=i > 0)
            for i, m in enumerate(models)
        ]

    def _build_optimizer(self) -> Any:
        import dataclasses as dc

        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optimizer = str(_get(self.values, "optimizer", "adam"))
        if optimizer != "adam":
            raise ValueError(f"--optimizer {optimizer}: the megatron backend runs adam")
        wanted: dict[str, Any] = {
            "optimizer": "adam",
            "lr": self.config.lr_schedule.lr_at(0),
            "min_lr": self.config.lr_schedule.min_lr,
            "weight_decay": self.config.weight_decay,
            "adam_beta1": self.config.adam_beta1,
            "adam_beta2": self.config.adam_beta2,
            "adam_eps": self.config.adam_eps,
            "clip_grad": float(self.config.clip_grad or 0.0),
            "bf16": bool(self.model_config.bf16),
            "fp16": bool(self.model_config.fp16),
            "params_dtype": self.model_config.params_dtype,
            "use_distributed_optimizer": True,
            "overlap_param_gather": self.ddp_config.overlap_param_gather,
            "optimizer_cpu_offload": bool(_get(self.values, "optimizer_cpu_offload", False)),
            "optimizer_offload_fraction": float(_get(self.values, "optimizer_offload_fraction", 1.0)),
            "use_torch_optimizer_for_cpu_offload": bool(
                _get(self.values, "use_torch_optimizer_for_cpu_offload", False)
            ),
            "overlap_cpu_optimizer_d2h_h2d": bool(_get(self.values, "overlap_cpu_optimizer_d2h_h2d", False)),
            # Megatron-LM requires it with `optimizer-cpu-offload` (the hybrid optimizer reuses its path: main
            # gradients as `decoupled_grad`); without the offload it needs TransformerEngine's FusedAdam
            "use_precision_aware_optimizer": bool(_get(self.values, "use_precision_aware_optimizer", False)),
        }
        if self.model_config.fp16:
            wanted.update(
                loss_scale=self.values.get("loss_scale"),
                initial_loss_scale=float(_get(self.values, "initial_loss_scale", 2**32)),
                min_loss_scale=float(_get(self.values, "min_loss_scale", 1.0)),
                loss_scale_window=float(_get(self.values, "loss_scale_window", 1000)),
                hysteresis=int(_get(self.values, "hysteresis", 2)),
            )
        known = {f.name for f in dc.fields(OptimizerConfig)}
        missing = sorted(k for k in wanted if k not in known)
        if missing:
            raise ValueError(f"the installed megatron-core's OptimizerConfig lacks {', '.join(missing)}")
        optimizer_obj = get_megatron_optimizer(OptimizerConfig(**wanted), self.ddp_models)
        # torch's Adam, which megatron takes without TE/Apex, through its fused kernel (kernels.fuse_adam)
        self.fused_adam = fuse_adam(optimizer_obj)
        # what megatron's training loop wires into the config the schedules read
        cfg = self.model_config
        cfg.finalize_model_grads_func = finalize_model_grads
        no_sync = [m.no_sync for m in self.ddp_models]
        cfg.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        if self.ddp_config.overlap_grad_reduce:
            grad_sync = [m.start_grad_sync for m in self.ddp_models]
            cfg.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync
        if self.ddp_config.overlap_param_gather:
            param_sync = [m.start_param_sync for m in self.ddp_models]
            cfg.param_sync_func = param_sync[0] if len(param_sync) == 1 else param_sync
        if cfg.fp16:
            cfg.grad_scale_func = optimizer_obj.scale_loss
        return optimizer_obj

    # -- batches -----------------------------------------------------------------------------------------------
    def _dp_rows(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """Which rows of `batch` each data-parallel rank takes: contiguous shares of equal size (±1), or,
        under `balance-data`, shares of the same sizes whose token counts are balanced
        (`balanced_rows`)."""
        sizes = split_evenly(batch.batch_size, self.dp_size)
        if min(sizes) == 0:
            raise ValueError(
                f"{batch.batch_size} sample(s) cannot be shared by {self.dp_size} data-parallel ranks: use a "
                "global-batch-size (and rollout) of at least the data-parallel size"
            )
        if self.values.get("balance_data"):
            return balanced_rows(batch.attention_mask.sum(dim=1), sizes)
        starts = [sum(sizes[:rank]) for rank in range(self.dp_size)]
        return [torch.arange(start, start + size) for start, size in zip(starts, sizes, strict=True)]

    def _dp_share(self, batch: RolloutBatch) -> RolloutBatch:
        """This data-parallel rank's share of `batch`'s rows (`_dp_rows`)."""
        if self.dp_size == 1:
            return batch
        return batch.select(self._dp_rows(batch)[self.dp_rank])

    @property
    def packs_sequences(self) -> bool:
        """`--qkv-format thd` (Relax's default): micro-batches are packed sequences, not padded rows."""
        return _get(self.values, "qkv_format", "thd") == "thd"

    def _schedule_micros(self, parts: list[RolloutBatch]) -> tuple[list[_Micro], int, int]:
        """The micro-batches in the shapes the schedule needs, with the schedule's `seq_length` and
        `micro_batch_size`. Under sequence parallelism the sequence axis is a multiple of the tensor-parallel
        size, and under context parallelism every sequence one of 2 x the context-parallel size (each CP rank's
        two chunks, `parallel.cp_columns`); with pipeline parallelism every micro-batch has one shape (the stages
        exchange fixed-shape activations). `thd`: one pack per micro-batch (`packed_micro`); `bshd`: padded rows
        (`padded_micro`)."""
        sp = self.layout.tp if self.layout.sequence_parallel else 1
        cp = self.layout.cp
        uniform = self.layout.pp > 1
        if self.packs_sequences:
            multiple = 2 * cp if cp > 1 else 1
            total_multiple = math.lcm(multiple, sp * cp)
            total = max(packed_length(p, multiple, total_multiple) for p in parts) if uniform else 0
            micros = [packed_micro(p, multiple, total_multiple, total) for p in parts]
            return micros, max(int(m.tokens.shape[1]) for m in micros), 1
        multiple = sp * (2 * cp if cp > 1 else 1)
        max_rows = max(p.batch_size for p in parts)
        max_width = max(int(p.tokens.shape[1]) for p in parts)
        micros = []
        for part in parts:
            rows = max_rows if uniform else part.batch_size
            width = max_width if uniform else int(part.tokens.shape[1])
            micros.append(padded_micro(part, rows, -(-width // multiple) * multiple))
        seq = max(int(m.tokens.shape[1]) for m in micros)
        return micros, seq, max(int(m.tokens.shape[0]) for m in micros)

    # -- the schedule ------------------------------------------------------------------------------------------
    def _forward_step(self, loss_for: Any, data_iterator: Iterator[_Micro], model: Any) -> tuple[Any, Any]:
        """megatron's `forward_step_func`: the chunk's forward with the final hidden states as output on the
        last stage (the loss head is `kernels.token_log_probs_and_entropy`, not the output layer's logits).
        Under context parallelism the model sees this CP rank's columns of the micro-batch
        (`_Micro.columns`); megatron's RoPE takes the same slice of its frequencies itself."""
        micro = next(data_iterator)
        device = self.device.torch_device
        tokens = to_device(micro.tokens, device)
        positions = to_device(micro.positions, device)
        if self.layout.cp > 1:
            columns = to_device(micro.columns(self.layout.cp, self.cp_rank), device)
            tokens, positions = tokens[:, columns], positions[:, columns]
        gpt = unwrap(model)
        last = gpt.post_process
        gpt.post_process = False  # GPTModel then returns the decoder's (normed) hidden states [s, b, h]
        # Float16Module would upcast the last stage's output to fp32, which the head casts straight back to
        # the weights' dtype: keep it in bf16/fp16 (the same values, one fp32 copy of the hidden states less)
        kwargs: dict[str, Any] = (
            {"fp32_output": False} if self.model_config.bf16 or self.model_config.fp16 else {}
        )
        if micro.packed:
            kwargs["packed_seq_params"] = micro.packed_seq_params(device)
        try:
            output = model(tokens, positions, None, **kwargs)
        finally:
            gpt.post_process = last
        if not last:
            return output, None
        return output, partial(loss_for, micro, gpt)

    def _run(
        self,
        models: list,
        micros: list[_Micro],
        seq: int,
        rows: int,
        loss_for: Any,
        *,
        forward_only: bool,
    ) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        chunks = len(models)
        data: Any = iter(micros) if chunks == 1 else [iter(micros) for _ in range(chunks)]
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_for),
            data_iterator=data,
            model=models if chunks > 1 else models[0],
            num_microbatches=len(micros),
            seq_length=seq,
            micro_batch_size=rows,
            forward_only=forward_only,
        )

    def _per_token(
        self, models: list, batch: RolloutBatch, parts: list[RolloutBatch], loss_for: Any, key: str
    ) -> torch.Tensor:
        """Forward only: what the last stage's `loss_for` reports under `key` ([rows, width] per micro-batch)
        for `parts` (this rank's data-parallel share of `batch`, in micro-batches), as [B, T] in batch order
        on every rank (every data-parallel replica's share gathered)."""
        micros, seq, rows = self._schedule_micros(parts)
        for model in models:
            model.eval()
        try:
            outputs = self._run(models, micros, seq, rows, loss_for, forward_only=True)
        finally:
            if models is self.ddp_models:  # the trained chunks go back to training (frozen ones stay in eval)
                for model in models:
                    model.train()
        width = int(batch.tokens.shape[1])
        mine = None
        if self.is_last_stage and self.tp_rank == 0 and self.cp_rank == 0:  # CP ranks hold the same rows
            mine = (
                self.dp_rank,
                torch.cat(
                    [torch.nn.functional.pad(o[key], (0, width - o[key].shape[1])) for o in outputs]
                ).cpu(),
            )
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        shares = sorted((item for item in gathered if item is not None), key=lambda item: item[0])
        stacked = torch.cat([values for _, values in shares])
        if self.dp_size == 1:
            return stacked
        order = torch.cat(self._dp_rows(batch))  # the batch row of each stacked row
        out = torch.empty_like(stacked)
        out[order] = stacked
        return out

    def _train(self, batch: RolloutBatch, loss_for: Any) -> dict[str, float]:
        """One pass over `batch`: optimizer steps of `global-batch-size` samples, each accumulated over
        micro-batches of this rank's data-parallel share, each micro-batch weighted as the torch backend
        weighs it (`micro.weight`). `loss_for(num_micro, micro, gpt, hidden)` -> (loss, {name: (value,
        weight)}). Metrics (rank 0): the losses' terms and grad_norm averaged over the optimizer steps, lr,
        optimizer_steps."""
        install_cpu_shims()
        self._require_onloaded()
        global_size = self.config.global_batch_size or batch.batch_size
        history: dict[str, list[float]] = defaultdict(list)
        for model in self.ddp_models:
            model.train()
        for start in range(0, batch.batch_size, global_size):
            global_batch = batch.select(slice(start, start + global_size))
            share = self._dp_share(global_batch)
            micros, seq, rows = self._schedule_micros(self._micro_batches(share))
            for micro in micros:  # shares of the whole step (every rank's rows), so DDP's sum is the step's
                micro.weight = micro_batch_weight(
                    micro.batch, global_batch, per_token_loss=self.config.loss.per_token_loss
                )
            for model in self.ddp_models:
                model.zero_grad_buffer()
            self.optimizer.zero_grad()
            outputs = self._run(
                self.ddp_models, micros, seq, rows, partial(loss_for, len(micros)), forward_only=False
            )
            lr = self.config.lr_schedule.lr_at(self.optimizer_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            _, grad_norm, _ = self.optimizer.step()
            self.optimizer_steps += 1
            step_metrics = self._reduce_metrics(outputs)
            history["grad_norm"].append(float(grad_norm) if grad_norm is not None else math.nan)
            for name, value in step_metrics.items():
                history[name].append(value)
        summary = {name: sum(values) / len(values) for name, values in history.items()}
        summary["lr"] = float(self.optimizer.param_groups[0]["lr"])
        summary["optimizer_steps"] = float(self.optimizer_steps)
        if (
            self.model_config.fp16
        ):  # after the last step: halved by an overflow (skipped step), grown by a window
            summary["loss_scale"] = float(self.optimizer.get_loss_scale())
        return summary

    def _micro_batches(self, share: RolloutBatch) -> list[RolloutBatch]:
        """This rank's share in training micro-batches: `micro-batch-size` rows, or `max-tokens-per-gpu` tokens
        (x cp, `_token_budget`) under dynamic batch size."""
        return micro_batches(
            share, self.config.micro_batch_size, self._token_budget(self.config.max_tokens_per_micro_batch)
        )

    def _token_budget(self, per_gpu: int | None) -> int | None:
        """A micro-batch's token budget from a per-GPU one (`max-tokens-per-gpu`,
        `log-probs-max-tokens-per-gpu`): x the context-parallel size, as in Relax (each CP rank holds 1 / cp of
        a micro-batch's tokens)."""
        return per_gpu if per_gpu is None or self.layout.cp == 1 else int(per_gpu) * self.layout.cp

    def _loss_scale(self, micro: _Micro, num_micro: int) -> float:
        """What a micro-batch's loss is multiplied by before backward: the schedule divides by the number of
        micro-batches and DDP averages over data-parallel ranks; undoing both makes the gradient the torch
        backend's sum of weighted micro-batch losses.

        Under context parallelism every CP rank computes the same loss over the whole sequences (`_token_stats`
        gathers the per-token values) but its gradient holds only its own tokens' share; DDP sums the shares
        over the data-parallel-with-CP group (dp x cp ranks) and divides by dp x cp, and megatron's schedule
        multiplies a (loss, metrics) loss by the CP size (its legacy averaging, megatron-core 0.16 and 0.19),
        so the factor stays dp (test_two_ranks_match_the_torch_backend[cp2])."""
        return micro.weight * num_micro * self.dp_size

    def _reduce_metrics(self, outputs: list[dict]) -> dict[str, float]:
        """Sum the weighted micro-batch metrics of every data-parallel replica's last pipeline stage."""
        mine: dict[str, float] = defaultdict(float)
        if self.is_last_stage and self.tp_rank == 0 and self.cp_rank == 0:  # CP ranks report the same loss
            for item in outputs:
                for name, (value, weight) in item.items():
                    mine[name] += float(value) * weight
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, dict(mine))
        total: dict[str, float] = defaultdict(float)
        for part in gathered:
            for name, value in (part or {}).items():
                total[name] += value
        return dict(total)

    # -- memory ----------------------------------------------------------------------------------------------------
    def offload(self) -> None:
        """Free the accelerator's copy of the weights, gradients and optimizer state (colocated turns); a
        no-op move on CPU. Training refuses until `onload()`."""
        if self.device.kind.value == "cuda" and not self.offloaded:
            self._offloaded_storage = []
            weights = self._weight_storages()
            for tensor in self._device_tensors():
                host = tensor.detach().to("cpu", copy=True)
                is_weight = tensor.untyped_storage().data_ptr() in weights
                self._offloaded_storage.append((tensor, host, is_weight))
                tensor.untyped_storage().resize_(0)
            torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        if self.device.kind.value == "cuda" and self.offloaded:
            for tensor, host, _is_weight in self._offloaded_storage:
                tensor.untyped_storage().resize_(host.numel() * host.element_size())
                tensor.copy_(host)
            self._offloaded_storage = []
        self.offloaded = False

    def _frozen_models(self) -> list:
        """Forward-only chunks this rank also holds (the policy's reference model)."""
        return []

    def _weight_storages(self) -> set[int]:
        """The accelerator storages that hold the policy's weights (DDP's parameter buffers, or the
        parameters themselves), by data pointer."""
        return {
            param.untyped_storage().data_ptr()
            for model in self.ddp_models
            for param in model.parameters()
            if param.is_cuda
        }

    @contextmanager
    def _on_device(self) -> Iterator[None]:
        """Everything back on the device for the body of the `with` when offloaded (a checkpoint saved or
        loaded during a colocated trainer's rollout turn), offloaded again after it. An async save has staged
        its copies by then."""
        if not self.offloaded:
            yield
            return
        self.onload()
        try:
            yield
        finally:
            self.offload()

    @contextmanager
    def _weights_readable(self) -> Iterator[None]:
        """While offloaded on CUDA, the policy's weights back on the device for the body of the `with` (a
        colocated trainer hands its weights to the engines while offloaded); then freed again. Only the
        weights: gradients, optimizer state and the reference stay on the host."""
        if not (self.device.kind.value == "cuda" and self.offloaded):
            yield
            return
        restored = [(tensor, host) for tensor, host, is_weight in self._offloaded_storage if is_weight]
        for tensor, host in restored:
            tensor.untyped_storage().resize_(host.numel() * host.element_size())
            tensor.copy_(host)
        try:
            yield
        finally:
            for tensor, _host in restored:
                tensor.untyped_storage().resize_(0)
            torch.cuda.empty_cache()

    def _device_tensors(self) -> list[torch.Tensor]:
        """The distinct storages the trainer holds on the accelerator: DDP's parameter and gradient buffers,
        the optimizer's state and main parameters, the frozen models (`_frozen_models`)."""
        seen: set[int] = set()
        out: list[torch.Tensor] = []

        def add(tensor: Any) -> None:
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                key = tensor.untyped_storage().data_ptr()
                if key not in seen and tensor.untyped_storage().size() > 0:
                    seen.add(key)
                    out.append(tensor)

        for model in self.ddp_models:
            for buffer in list(getattr(model, "buffers", [])) + list(
                getattr(model, "expert_parallel_buffers", [])
            ):
                add(buffer.param_data)
                add(buffer.grad_data)
            for param in model.parameters():
                add(param.data)
        for inner in ckpt._distributed_optimizers(self.optimizer):
            torch_opt = getattr(inner, "optimizer", None)
            if torch_opt is None:
                continue
            for group in torch_opt.param_groups:
                for param in group["params"]:
                    add(param.data)
                    for value in torch_opt.state.get(param, {}).values():
                        add(value)
        for model in self._frozen_models():
            for param in model.parameters():
                add(param.data)
        return out

    def _require_onloaded(self) -> None:
        if self.offloaded:
            raise RuntimeError("train backend is offloaded; call onload() first")

    def _sync_params(self) -> None:
        """With `overlap-param-gather` the distributed optimizer's updated shards are gathered lazily, by the
        next forward; anything that reads the weights outside training gathers them first."""
        if self.ddp_config.overlap_param_gather:
            for model in self.ddp_models:
                model.start_param_sync(force_sync=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def _model_sharded_state(self, *, optimizer: bool, rng: bool, loading: bool) -> dict[str, Any]:
        """The sharded state of the trained chunks (`model`, `model{i}`), with the optimizer's and this
        rank's RNG states."""
        gpts = [unwrap(m) for m in self.models]
        state: dict[str, Any] = ckpt.model_sharded_state(gpts)
        if optimizer:
            if loading:
                ckpt.prepare_optimizer_for_load(self.optimizer)
            model_state = dict(state)
            state["optimizer"] = self.optimizer.sharded_state_dict(
                model_state,
                is_loading=loading,
                metadata=dict(ckpt.OPTIMIZER_SHARDING),
            )
        if rng:
            state["rng_state"] = ckpt.rng_sharded_object()
        return state

    def _parallel_state(self) -> dict[str, Any]:
        return {"tp": self.layout.tp, "pp": self.layout.pp, "vpp": self.layout.vpp, "dp": self.dp_size}

    def _save_sharded(
        self,
        save_dir: str,
        iteration: int,
        sharded: dict[str, Any],
        state: dict[str, Any],
        *,
        blocking: bool,
        state_file: str = ckpt.STATE_FILE,
    ) -> CheckpointRecord | None:
        """Write `sharded` (+ `state` as `state_file`) as `<save_dir>/iter_NNNNNNN/` after any saves still in
        flight (saves land in order); `blocking=False` leaves it to `finished_saves()`."""
        if blocking:
            for pending in list(self._pending_saves):
                self._finish(pending, wait=True)
            result = ckpt.save(
                save_dir,
                iteration,
                sharded,
                state,
                owner=self.config.owner,
                blocking=True,
                state_file=state_file,
            )
            return result if isinstance(result, CheckpointRecord) else None
        pending = ckpt.save(
            save_dir,
            iteration,
            sharded,
            state,
            owner=self.config.owner,
            blocking=False,
            state_file=state_file,
        )
        assert isinstance(pending, ckpt.PendingSave)
        self._pending_saves.append(pending)
        return None

    def _restore(self, loaded: dict[str, Any], *, with_optimizer: bool, with_rng: bool) -> None:
        """Put what `ckpt.load` read for `_model_sharded_state` back into the chunks, the optimizer (or, without
        its state, refresh the optimizer's own fp32 copy of the weights) and the RNGs."""
        gpts = [unwrap(m) for m in self.models]
        for i, gpt in enumerate(gpts):
            gpt.load_state_dict(loaded[ckpt.chunk_key(i, len(gpts))], strict=False)
        if with_optimizer:
            ckpt.load_optimizer_state(self.optimizer, loaded["optimizer"])
        else:
            # the distributed optimizer keeps its own fp32 copy of the weights: refresh it from the model
            for inner in ckpt._distributed_optimizers(self.optimizer):
                reload = getattr(inner, "reload_model_params", None)
                if reload is not None:
                    reload()
        if with_rng and "rng_state" in loaded:
            ckpt._set_rng_states(loaded["rng_state"])

    def _finish(self, pending: ckpt.PendingSave, *, wait: bool) -> CheckpointRecord | None | bool:
        result = ckpt.finish(pending, wait=wait)
        if result is not False:
            self._pending_saves.remove(pending)
        return result

    def finished_saves(self, *, wait: bool = False) -> list[CheckpointRecord]:
        """Records of the background saves every rank has finished writing (all of them with `wait`), in
        order; a collective."""
        install_cpu_shims()
        done: list[CheckpointRecord] = []
        for pending in list(self._pending_saves):
            result = self._finish(pending, wait=wait)
            if result is False:
                break
            if isinstance(result, CheckpointRecord):
                done.append(result)
        return done


@TRAIN_BACKENDS.register(TrainBackendName.MEGATRON)
class MegatronTrainBackend(MegatronModelRunner):
    """This rank's model chunks, optimizer and (for a KL term) frozen reference chunks."""

    def __init__(
        self,
        hf_checkpoint: str,
        config: TrainConfig,
        *,
        device: Device,
        need_ref: bool = False,
        context: TrainContext | None = None,
        random_init: bool = False,
    ) -> None:
        """`random_init`: start from megatron's own initialisation (`init-method-std`, seeded by `seed`)
        instead of loading weights; `hf_checkpoint` then only needs its `config.json` (benchmarks). The
        pipeline never sets it; `ref-load`, when set, still wins."""
        self.random_init = random_init
        self._start(hf_checkpoint, config, device, context or TrainContext())
        self.models = self._build_and_load(self._initial_weights())
        # torch.compile each transformer layer before DDP wraps the chunks (names and checkpoints unchanged);
        # the frozen reference stays eager (forward only, and no second set of graphs to compile)
        self.compiled_layers = self._compile_layers(self.models)
        self.trainable = self._select_trainable()
        self.ddp_models = self._wrap_ddp(self.models)
        self.optimizer = self._build_optimizer()
        self.ref_models: list | None = None
        if need_ref:
            self.ref_models = self._build_and_load(self._initial_weights())
            if self._initial_weights()[0] == "random":  # the reference starts where the policy starts
                for policy, reference in zip(self.models, self.ref_models, strict=True):
                    unwrap(reference).load_state_dict(unwrap(policy).state_dict())
            for model in self.ref_models:
                model.eval()
                model.requires_grad_(False)
        # on-policy distillation's teacher (`opd-teacher-load`): frozen chunks built like the reference's
        self.teacher_models: list | None = None
        if config.opd_teacher_load:
            source, iteration = self._teacher_weights()
            self.teacher_models = self._build_and_load(source, iteration=iteration)
            for model in self.teacher_models:
                model.eval()
                model.requires_grad_(False)
        self.head_save_budget = self._head_save_budget()
        log.info(
            "megatron rank %d: tp=%d pp=%d vpp=%s cp=%d dp=%d, %d layers, hidden %d, vocab %d (padded %d), %s, "
            "%d layers compiled, loss head keeps logits up to %.1f GiB",
            self.rank,
            self.layout.tp,
            self.layout.pp,
            self.layout.vpp,
            self.layout.cp,
            self.dp_size,
            self.args.num_layers,
            self.args.hidden_size,
            self.args.vocab_size,
            self.args.padded_vocab(self.layout.tp),
            self.model_config.params_dtype,
            self.compiled_layers,
            self.head_save_budget / 2**30,
        )

    # -- construction ------------------------------------------------------------------------------------------
    def _initial_weights(self) -> tuple[str, str]:
        """Where the policy starts: `ref-load` when set (as in Relax; a Hugging Face folder, or a checkpoint
        root of this backend), else `hf-checkpoint` (or megatron's random initialisation with `random_init`).
        Returns (kind, path), kind "hf", "megatron" or "random"."""
        ref_load = self.config.ref_load
        if not ref_load:
            return ("random" if self.random_init else "hf"), self.hf_checkpoint
        if ckpt.is_checkpoint_root(ref_load):
            return "megatron", ref_load
        return "hf", ref_load

    def _initial_step(self) -> int | None:
        return self.config.ref_ckpt_step  # `ref-ckpt-step`: which iteration of a checkpoint-root `ref-load`

    def _teacher_weights(self) -> tuple[tuple[str, str], int | None]:
        """The OPD teacher's source, as `ref-load`'s: a checkpoint root of this backend at
        `opd-teacher-ckpt-step` (else its latest iteration), or a Hugging Face folder. Returns (source,
        iteration) for `_build_and_load`."""
        load = str(self.config.opd_teacher_load)
        if not ckpt.is_checkpoint_root(load):
            return ("hf", load), None
        step = self.config.opd_teacher_ckpt_step
        return ("megatron", load), step if step is not None else relax_checkpoint.read_latest_iteration(load)

    def _head_save_budget(self) -> int:
        """Bytes of chunk logits the loss head may keep per micro-batch for its backward (`save_logits=True`:
        one [chunk, vocab / tp] matmul fewer per chunk; 51.5% vs 48.7% MFU at Qwen2-0.5B shapes on the H200).

        The estimate is deliberately simple, because what it guards is coarse: a micro-batch keeps
        chunks x chunk-tokens x padded-vocab / tp x 2 bytes (bf16) of logits, 4.6 GiB at 16 x 1024 tokens
        and Qwen's 151,936 ids. Only one micro-batch's head is live at a time on the last stage (the schedules
        run its backward right after its forward), so the budget is per micro-batch. It is measured once, here,
        after the model, optimizer and reference exist: a quarter of the device memory still free (counting
        the caching allocator's spare blocks) after setting aside Adam's two fp32 moments, which the
        optimizer creates lazily at its first step; the other three quarters stay for activations. It is
        capped at a tenth of the device, because a colocated rollout engine may take memory later that is
        free now. `RELAX_HEAD_SAVE_LOGITS=1` / `0` overrides it. 0 on CPU (recomputing is the CPU default)."""
        choice = os.environ.get(HEAD_SAVE_LOGITS_ENV, "auto").strip().lower()
        if choice in ("0", "false", "off", "no"):
            return 0
        if choice in ("1", "true", "on", "yes"):
            return 1 << 62
        if self.on_cpu or not torch.cuda.is_available():
            return 0
        free, total = torch.cuda.mem_get_info()
        free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        trainable = sum(p.numel() for m in self.models for p in m.parameters() if p.requires_grad)
        adam_moments = 8 * trainable // max(self.dp_size, 1)  # exp_avg + exp_avg_sq, fp32, this rank's shard
        return int(max(0, min((free - adam_moments) // 4, total // 10)))

    def keeps_head_logits(self, tokens: int) -> bool:
        """Whether the loss head keeps its logits for a training micro-batch of `tokens` predicted tokens:
        chunks x chunk-tokens x padded vocab / tp x element size within `head_save_budget`."""
        chunk = self._chunk_tokens()
        chunks = -(-tokens // chunk)
        v_shard = self.args.padded_vocab(self.layout.tp) // self.layout.tp
        itemsize = torch.empty((), dtype=self.model_config.params_dtype).element_size()
        return tokens > 0 and chunks * min(chunk, tokens) * v_shard * itemsize <= self.head_save_budget

    def _chunk_tokens(self) -> int:
        chunk = int(_get(self.values, "log_probs_chunk_size", -1))
        return chunk if chunk > 0 else DEFAULT_CHUNK_TOKENS

    def _select_trainable(self) -> tuple[str, ...]:
        """`only-train-params-name-list` / `freeze-params-name-list` over Megatron's parameter names."""
        named = [(name, p) for m in self.models for name, p in unwrap(m).named_parameters()]
        if not self.config.only_train_params and not self.config.freeze_params:
            return tuple(name for name, _ in named)
        selection = select_trainable_parameters(
            [name for name, _ in named],
            only_train=list(self.config.only_train_params) or None,
            freeze=list(self.config.freeze_params) or None,
        )
        trainable = set(selection.trainable)
        for name, param in named:
            param.requires_grad_(name in trainable)
        if selection.unmatched_patterns:
            log.warning(
                "parameter name pattern(s) %s matched no Megatron parameter",
                list(selection.unmatched_patterns),
            )
        return tuple(selection.trainable)

    # -- the loss head -----------------------------------------------------------------------------------------
    def _token_stats(
        self, micro: _Micro, gpt: Any, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs and entropies [rows, width] of the micro-batch's real rows (column 0 is 0, as
        `runtime.algos.logprobs` aligns them).

        Without context parallelism only the tokens that carry loss (`loss_mask`, via `_Micro.loss_positions`)
        go through the head and every other place is 0: each consumer masks by `loss_mask` (the losses,
        `compute_log_probs`, `evaluate_nll`), and a GRPO row of 512 prompt + 512 response tokens computes the
        151,936-wide logits for half its positions, as TRL does for the completion. A micro-batch with no loss
        token goes through the head whole (the backward needs a graph).

        Under context parallelism every fed position goes through the head (`_Micro.targets` says what each
        predicts, `_Micro.unpack` maps them back onto the rows, padded or packed): `hidden` holds this CP
        rank's columns (`_Micro.columns`), each predicting the next token of its whole sequence, and the
        per-token values are all-gathered over the CP group into sequence order (the gradient back to each
        rank is its own columns'), so the loss sees whole sequences as without CP."""
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        if self.layout.sequence_parallel:
            # the head all-reduces the hidden states' gradient itself: the gather's backward only splits
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        device = hidden.device
        cp = self.layout.cp
        weight = gpt.shared_embedding_or_output_weight() if self.args.tied else gpt.output_layer.weight

        def head(states: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = int(targets.numel())
            log_probs, entropy = token_log_probs_and_entropy(
                states,
                weight,
                targets,
                vocab_size=self.args.vocab_size,
                temperature=self.config.log_probs_temperature,
                tp_group=self.tp_group if self.layout.tp > 1 else None,
                chunk_tokens=self._chunk_tokens(),
                with_entropy=True,
                save_logits=torch.is_grad_enabled() and self.keeps_head_logits(tokens),
            )
            return log_probs, entropy  # type: ignore[return-value]

        if cp == 1 and os.environ.get(HEAD_ALL_POSITIONS_ENV, "0") != "1":
            # only the positions that carry loss go through the head (a GRPO row's prompt half carries none)
            states, targets, places = micro.at_loss_positions(hidden)
            if places.numel() > 0:
                log_probs, entropy = head(states, targets)
                return micro.spread(log_probs, places), micro.spread(entropy, places)
        targets = to_device(micro.targets, device).t()  # [s, b]: the token each position predicts (0: none)
        if cp > 1:
            targets = targets[to_device(micro.columns(cp, self.cp_rank), device)]
        log_probs, entropy = head(hidden, targets)
        if cp > 1:
            order = to_device(cp_sequence_order(micro.sequences, cp), device)

            def whole(values: torch.Tensor) -> torch.Tensor:
                gathered = gather_from_sequence_parallel_region(
                    values.contiguous(), tensor_parallel_output_grad=False, group=self.cp_group
                )
                return gathered[order]  # [s, b] in sequence order

            log_probs, entropy = whole(log_probs), whole(entropy)
        return micro.unpack(log_probs), micro.unpack(entropy)

    def _train_loss(
        self, num_micro: int, micro: _Micro, gpt: Any, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        loss_fn = resolve_loss_fn(self.config.loss_type, self.config.loss.custom_loss_function_path)
        log_probs, entropy = self._token_stats(micro, gpt, hidden)
        if self.config.loss.entropy_coef == 0:
            entropy = entropy.detach()
        inputs = policy_loss_inputs(
            micro.batch,
            log_probs,
            entropy,
            move=to_device,
            old_from_forward=self.config.old_log_probs_from_forward,
        )
        loss, metrics = loss_fn(inputs, self.config.loss)
        # (value, weight) pairs, read after the whole step (`_reduce_metrics`): a float() here would make the
        # host wait for the device after every micro-batch instead of queueing the next one
        reported: dict[str, Any] = {"loss": (loss.detach(), micro.weight)}
        for name, value in metrics.items():
            reported[name] = (value.detach(), micro.weight)
        return loss * self._loss_scale(micro, num_micro), reported

    def _log_prob_loss(self, micro: _Micro, gpt: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        log_probs, _ = self._token_stats(micro, gpt, hidden)
        # kept on the device: `_per_token` moves the whole pass's values to the host once, after the last
        # micro-batch (a `.cpu()` here would wait for each micro-batch before the next is queued)
        return log_probs.sum() * 0.0, {"log_probs": log_probs.detach()}

    # -- log-probs -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _log_probs(self, models: list, batch: RolloutBatch) -> torch.Tensor:
        """log p of every token of `batch` under `models` [B, T], on every rank; each
        data-parallel replica computes its share, in micro-batches of `log-probs-max-tokens-per-gpu` tokens
        when set, else the training micro-batches."""
        install_cpu_shims()
        share = self._dp_share(batch)
        budget = self._token_budget(self.config.log_probs_max_tokens)
        parts = share.token_budget_batches(int(budget)) if budget else self._micro_batches(share)
        return self._per_token(models, batch, parts, self._log_prob_loss, "log_probs")

    def compute_log_probs(self, batch: RolloutBatch, *, old: bool = True, ref: bool = True) -> RolloutBatch:
        """`old_log_probs` (the policy before this update), with a reference model `ref_log_probs` and with an
        OPD teacher `teacher_log_probs`, as the torch backend fills them (every rank returns the same batch)."""
        self._require_onloaded()
        self._sync_params()
        models = (self.ddp_models if old else None, self.ref_models if ref else None, self.teacher_models)
        return fill_log_probs(batch, self._log_probs, *models)

    @torch.no_grad()
    def evaluate_nll(self, batch: RolloutBatch) -> tuple[float, int]:
        self._require_onloaded()
        self._sync_params()
        log_probs = self._log_probs(self.ddp_models, batch)
        mask = batch.loss_mask
        return float(-(log_probs * mask).sum()), int(mask.sum())

    # -- the update -----------------------------------------------------------------------------------------------
    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One pass over `batch`: optimizer steps of `global-batch-size` samples, each accumulated over
        micro-batches (`micro-batch-size`, or `max-tokens-per-gpu` tokens with `use-dynamic-batch-size`)
        of this rank's data-parallel share. Metrics (rank 0) are the torch backend's, averaged over the
        optimizer steps: loss and the loss type's terms, grad_norm, lr, optimizer_steps."""
        return self._train(batch, self._train_loss)

    def update_reference(self) -> None:
        """`ref-update-interval`: the reference model takes the policy's current weights."""
        if self.ref_models is None:
            raise RuntimeError("ref-update-interval needs a reference model (use-kl-loss with ref-load)")
        self._sync_params()
        for policy, reference in zip(self.models, self.ref_models, strict=True):
            unwrap(reference).load_state_dict(unwrap(policy).state_dict())

    # -- weights out -----------------------------------------------------------------------------------------------
    def named_weights(self) -> dict[str, torch.Tensor]:
        """The policy as Hugging Face tensors (CPU), gathered on rank 0 (a collective; {} on other ranks)."""
        install_cpu_shims()
        with self._weights_readable():
            self._sync_params()
            state = gather_hf_state(self.models, self.args, self.layout, dst=0)
        return state or {}

    def iter_device_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy as (Hugging Face name, tensor) pairs on this rank's device, one piece (embedding, each
        layer, final norm and head) at a time: what a rollout engine colocated in this process copies in place
        (`runtime.weight_sync.in_place`). Tensors the two layouts share are the live parameters (detached);
        the fused q/k/v and gate/up matrices are split into new device tensors. Tensor-parallel shards are
        all-gathered (a collective over the tensor-parallel group: every rank iterates to the end). Only this
        pipeline stage's tensors: with pipeline parallelism an engine would miss the rest and refuse."""
        install_cpu_shims()
        with self._weights_readable():
            self._sync_params()
            yield from iter_stage_hf_state(self.models, self.args, self.layout)

    def parameter_checksum(self) -> float:
        """Sum of |w| over the gathered Hugging Face weights (comparable with the torch backend's)."""
        weights = self.named_weights()
        return float(sum(t.double().abs().sum() for t in weights.values()))

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord | None:
        """A Hugging Face folder (weights, the source's config, generation config and tokenizer files) at
        `out_dir`, written by rank 0; never replaces a folder this job does not own."""
        weights = self.named_weights()
        result: list[Any] = [None]
        if dist.get_rank() == 0:
            try:
                with atomic_directory(out_dir, owner=self.config.owner) as scratch:
                    write_hf_folder(weights, scratch, self.args, source=self.hf_checkpoint)
                result[0] = record(Path(out_dir), step, CheckpointFormat.HF)
            except Exception as exc:  # noqa: BLE001 - raised on rank 0 below, with its own type
                result[0] = exc
        if isinstance(result[0], Exception):
            raise result[0]
        return result[0]

    # -- memory ----------------------------------------------------------------------------------------------------
    def _frozen_models(self) -> list:
        return (self.ref_models or []) + (self.teacher_models or [])

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def _keeps_reference(self) -> bool:
        return self.ref_models is not None and self.config.ref_update_interval is not None

    def _sharded_state(self, *, optimizer: bool, rng: bool, reference: bool, loading: bool) -> dict[str, Any]:
        state = self._model_sharded_state(optimizer=optimizer, rng=rng, loading=loading)
        if reference and self.ref_models is not None:
            refs = [unwrap(m) for m in self.ref_models]
            for key, value in ckpt.model_sharded_state(refs, prefix=ckpt.REFERENCE_PREFIX).items():
                state["ref_" + key] = value
        return state

    def save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], *, blocking: bool = True
    ) -> CheckpointRecord | None:
        """See `_save_checkpoint`; runs with the trainer on its device (`_on_device`)."""
        with self._on_device():
            return self._save_checkpoint(save_dir, iteration, extra_state, blocking=blocking)

    def _save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], *, blocking: bool = True
    ) -> CheckpointRecord | None:
        """`<save_dir>/iter_NNNNNNN/` in torch_dist (a collective). `blocking=False` (`async-save`): the state
        is staged now and written by a thread; `finished_saves()` completes it."""
        install_cpu_shims()
        self._sync_params()
        with_optimizer = self.config.save_optimizer
        sharded = self._sharded_state(
            optimizer=with_optimizer, rng=True, reference=self._keeps_reference(), loading=False
        )
        state = {
            "layout": ckpt.CHECKPOINT_LAYOUT,
            "iteration": iteration,
            "optimizer_steps": self.optimizer_steps,
            "has_optimizer": with_optimizer,
            "has_reference": self._keeps_reference(),
            "parallel": self._parallel_state(),
            "extra": extra_state,
        }
        return self._save_sharded(save_dir, iteration, sharded, state, blocking=blocking)

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        """See `_load_checkpoint`; runs with the trainer on its device (`_on_device`)."""
        with self._on_device():
            return self._load_checkpoint(load_dir)

    def _load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        """Restore the latest iteration under `load_dir` (model; optimizer unless `no-load-optim` or the
        checkpoint has none; RNG unless `no-load-rng`; the reference model if it was saved). `finetune`:
        the weights only, and the run starts from rollout 0 (returns None). None when there is no
        checkpoint yet."""
        install_cpu_shims()
        found = ckpt.latest(load_dir)
        if found is None:
            return None
        iteration, folder, state = found
        finetune = bool(self.values.get("finetune"))
        with_optimizer = (
            bool(state.get("has_optimizer", True)) and not self.values.get("no_load_optim") and not finetune
        )
        with_rng = not self.values.get("no_load_rng") and not finetune
        with_reference = bool(state.get("has_reference")) and self.ref_models is not None
        sharded = self._sharded_state(
            optimizer=with_optimizer, rng=with_rng, reference=with_reference, loading=True
        )
        loaded = ckpt.load(folder, sharded)
        self._restore(loaded, with_optimizer=with_optimizer, with_rng=with_rng)
        if with_optimizer:  # a checkpoint's parameter groups and step counts, back on the fused kernel
            self.fused_adam = fuse_adam(self.optimizer)
        if with_reference and self.ref_models is not None:
            refs = [unwrap(m) for m in self.ref_models]
            for i, ref in enumerate(refs):
                ref.load_state_dict(loaded["ref_" + ckpt.chunk_key(i, len(refs))], strict=False)
        if finetune:
            log.info(
                "finetune: weights of %s iteration %d loaded; starting at rollout 0", load_dir, iteration
            )
            return None
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        log.info(
            "loaded %s (optimizer: %s, rng: %s, reference: %s)",
            folder,
            with_optimizer,
            with_rng,
            with_reference,
        )
        return iteration, dict(state.get("extra", {}))


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device` without making the host wait for the device. `.to("cuda")` of pageable host memory
    synchronizes the stream: each micro-batch's inputs (tokens, positions, targets, masks) would let the device's
    queue run dry before the next forward is launched (54 such waits, 11.6 ms of idle device per 0.5B step on the
    H200: `bench.gpu_train --profile-dir`, docs/benchmarks.md). Through pinned memory the copy is queued instead
    (torch's caching host allocator keeps the pinned block until the copy has run). An expanded view, such as the
    positions' rows, is made whole first: its pinned copy would alias."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.contiguous().pin_memory().to(device, non_blocking=True)


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return to_device(tensor, device) if tensor is not None else None
