"""The `torch` training backend: a Hugging Face causal LM trained with AdamW on CPU or one GPU."""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from runtime.access import LOCAL_OWNER
from runtime.algos.freezing import apply_parameter_selection, select_trainable_parameters
from runtime.algos.losses import LossConfig, LossInputs, resolve_loss_fn, token_entropy, token_log_probs
from runtime.algos.reducers import token_count
from runtime.devices import Device
from runtime.train.base import TRAIN_BACKENDS, TrainBackendName, TrainContext
from runtime.train.checkpoint import (
    CheckpointFormat,
    CheckpointRecord,
    atomic_directory,
    iteration_dir,
    latest_complete_iteration,
    record,
    resolve_model_folder,
    write_latest_iteration,
)
from runtime.train.schedule import LRSchedule
from runtime.types import RolloutBatch

# transformers is imported where a model is loaded (`_transformers`): `import transformers` costs ~1.2 s of
# CPU and transformers.modeling_utils ~1.5 s more, which the processes that import this module for its configs
# and batching helpers and never load a Hugging Face model with it (the driver; a megatron rank, trainer or
# critic) are spared
if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def _transformers() -> Any:
    """The transformers package, its progress bars off (this module's model loads log no bars)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    return transformers


STATE_FILE = (
    "trainer_state.json"  # inside iter_NNNNNNN/: iteration, weight version, the driver's data position
)
REFERENCE_DIR = "ref_model"  # inside iter_NNNNNNN/ when `ref-update-interval` moves the reference
CHECKPOINT_LAYOUT = "relax-torch/1"


@dataclass(frozen=True)
class OptimizerConfig:
    """The spec fields both the policy's trainer and the critic read: the loss parameters, the optimizer and
    its schedule, the batching, who owns the checkpoints. `TrainConfig` adds the policy's own; the critic's
    `CriticConfig` (runtime/train/critic.py) is this."""

    lr_schedule: LRSchedule = field(default_factory=lambda: LRSchedule(lr=1e-6))
    loss: LossConfig = field(default_factory=LossConfig)
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    seed: int = 1234
    global_batch_size: int | None = None  # samples per optimizer step; None = the whole rollout in one step
    micro_batch_size: int = 1
    max_tokens_per_micro_batch: int | None = None  # `max-tokens-per-gpu` under `use-dynamic-batch-size`
    # who the checkpoint and export folders belong to (runtime.access.owner_of): only its own are replaced
    owner: str = LOCAL_OWNER


@dataclass(frozen=True)
class TrainConfig(OptimizerConfig):
    """The spec fields the torch backend reads: `OptimizerConfig`'s and the policy's own."""

    loss_type: str = "policy_loss"
    # `log-probs-max-tokens-per-gpu`: forward-only passes (old/ref log-probs, eval NLL) in micro-batches of
    # at most this many tokens; None: chunks of `LOG_PROB_ROWS` rows
    log_probs_max_tokens: int | None = None
    log_probs_temperature: float = 1.0  # the rollout temperature: log-probs are of softmax(logits / T)
    save_optimizer: bool = True  # False = `no-save-optim`
    # `ref-load`: the reference model, and the policy's initial weights (an HF folder or a checkpoint root)
    ref_load: str | None = None
    ref_ckpt_step: int | None = None  # `ref-ckpt-step`: which iteration of a ckpt-root `ref-load`
    # `ref-update-interval`: the reference follows the policy, so checkpoints carry its weights too
    ref_update_interval: int | None = None
    # `opd-teacher-load` / `opd-teacher-ckpt-step` (on-policy distillation with `opd-type megatron`): a frozen
    # teacher of the policy's architecture (an HF folder or a checkpoint root of the backend); None = none
    opd_teacher_load: str | None = None
    opd_teacher_ckpt_step: int | None = None
    # `only-train-params-name-list` / `freeze-params-name-list`: regexes over the HF parameter names
    only_train_params: tuple[str, ...] = ()
    freeze_params: tuple[str, ...] = ()
    # true-on-policy mode with one optimizer step per rollout and no reader of the old log-probs before the
    # loss (`runtime.pipeline.plans.old_log_probs_from_train_forward`): nobody recomputes them, and a batch
    # without them takes the train forward's own log-probs, detached, as pi_old (`policy_loss_inputs`)
    old_log_probs_from_forward: bool = False


@dataclass
class _Snapshot:
    """A checkpoint's content copied off the live model, so writing it can overlap training (`async-save`)."""

    iteration: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None
    rng_state: torch.Tensor
    ref_state: dict[str, torch.Tensor] | None
    state: dict[str, Any]


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each token among the real tokens of its row, as `generate` numbers them.

    Without these, a left-padded row would start at position > 0 and its log-probs would drift from the
    rollout engine's (see NOTES: they agree to 1e-6 only with matching position ids).
    """
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


class OptimizerStepper:
    """`_clip_and_step` for a one-process torch trainer (the policy's `TorchTrainBackend`, the critic's
    `TorchCriticBackend`): it has `model`, `optimizer`, `optimizer_steps` and a config with `clip_grad`
    and `lr_schedule`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    optimizer_steps: int
    config: Any

    def _clip_and_step(self) -> float:
        """`clip_and_step` at the schedule's lr for this step; counts the step. Returns the grad norm."""
        grad_norm = clip_and_step(
            self.model,
            self.optimizer,
            self.config.clip_grad,
            self.config.lr_schedule.lr_at(self.optimizer_steps),
        )
        self.optimizer_steps += 1
        return grad_norm


@TRAIN_BACKENDS.register(TrainBackendName.TORCH)
class TorchTrainBackend(OptimizerStepper):
    """Owns the policy (and, for a KL loss, a frozen reference copy; for on-policy distillation, a frozen
    teacher) and its AdamW optimizer.

    Weights come from `ref-load` when it is set (as in Relax, the reference checkpoint is also where the
    policy starts when there is nothing to resume), else from `hf-checkpoint`, which always supplies the
    tokenizer of HF exports.
    """

    def __init__(
        self,
        hf_checkpoint: str,
        config: TrainConfig,
        *,
        device: Device,
        need_ref: bool = False,
        context: TrainContext | None = None,
    ) -> None:
        if context is not None and context.world_size != 1:
            raise ValueError(f"the torch backend trains in one process, got a world of {context.world_size}")
        torch.manual_seed(config.seed)
        self.config = config
        self.device = device
        self.hf_checkpoint = hf_checkpoint
        initial = (
            resolve_model_folder(config.ref_load, config.ref_ckpt_step)
            if config.ref_load
            else Path(hf_checkpoint)
        )
        self.model: PreTrainedModel = _transformers().AutoModelForCausalLM.from_pretrained(
            initial, dtype=torch.float32
        )
        self.model.to(device.torch_device)
        self.model.train()
        self.ref_model: PreTrainedModel | None = None
        if need_ref:
            self.ref_model = _transformers().AutoModelForCausalLM.from_pretrained(
                initial, dtype=torch.float32
            )
            self.ref_model.to(device.torch_device).eval().requires_grad_(False)
        self.teacher_model: PreTrainedModel | None = None
        if config.opd_teacher_load:
            teacher = resolve_model_folder(config.opd_teacher_load, config.opd_teacher_ckpt_step)
            self.teacher_model = _transformers().AutoModelForCausalLM.from_pretrained(
                teacher, dtype=torch.float32
            )
            self.teacher_model.to(device.torch_device).eval().requires_grad_(False)
        self.trainable_parameters = select_policy_parameters(self.model, config)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr_schedule.lr_at(0),
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.optimizer_steps = 0
        self.offloaded = False
        self._saver: ThreadPoolExecutor | None = None  # one writer thread: saves land in order
        self._pending_saves: list[Future[CheckpointRecord]] = []

    # -- forward passes ----------------------------------------------------------------------------------
    def _forward(self, model: PreTrainedModel, batch: RolloutBatch) -> torch.Tensor:
        device = self.device.torch_device
        mask = batch.attention_mask.to(device)
        out = model(
            input_ids=batch.tokens.to(device), attention_mask=mask, position_ids=position_ids_for(mask)
        )
        return out.logits  # [B, T, V]

    @torch.no_grad()
    def _log_probs(self, model: PreTrainedModel, batch: RolloutBatch) -> torch.Tensor:
        was_training = model.training
        model.eval()
        parts = [
            token_log_probs(
                self._forward(model, part),
                part.tokens.to(self.device.torch_device),
                self.config.log_probs_temperature,
            ).cpu()
            for part in log_prob_batches(batch, self.config.log_probs_max_tokens)
        ]
        model.train(was_training)
        width = batch.tokens.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])

    def compute_log_probs(self, batch: RolloutBatch, *, old: bool = True, ref: bool = True) -> RolloutBatch:
        """Fill `old_log_probs` (the policy before this update), with a reference model `ref_log_probs`
        (`old`/`ref` False: another role computes them) and with an OPD teacher `teacher_log_probs`.

        `old_log_probs` is always the trainer's own recompute, also under `use-rollout-logprobs` (the loss
        then takes the engine's as the ratio's pi_old): TIS and the mismatch metrics compare the two, and a
        copy of the engine's would make every TIS weight 1."""
        self._require_onloaded()
        models = (self.model if old else None, self.ref_model if ref else None, self.teacher_model)
        return fill_log_probs(batch, self._log_probs, *models)

    # -- the update --------------------------------------------------------------------------------------
    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One pass over `batch`: optimizer steps of `global_batch_size` samples, each accumulated over
        micro-batches of `micro_batch_size`. Returns metrics averaged over the optimizer steps."""
        self._require_onloaded()
        loss_fn = resolve_loss_fn(self.config.loss_type, self.config.loss.custom_loss_function_path)
        # the entropy bonus needs entropy with its graph; otherwise it is only a metric
        live_entropy = self.config.loss.entropy_coef != 0
        global_size = self.config.global_batch_size or batch.batch_size
        history: dict[str, list[float]] = defaultdict(list)
        for start in range(0, batch.batch_size, global_size):
            global_batch = batch.select(slice(start, start + global_size))
            step_metrics: dict[str, float] = defaultdict(float)
            for micro in self._micro_batches(global_batch):
                weight = micro_batch_weight(
                    micro, global_batch, per_token_loss=self.config.loss.per_token_loss
                )
                logits = self._forward(self.model, micro)
                temperature = self.config.log_probs_temperature
                inputs = policy_loss_inputs(
                    micro,
                    token_log_probs(logits, micro.tokens.to(logits.device), temperature),
                    token_entropy(logits if live_entropy else logits.detach(), temperature),
                    old_from_forward=self.config.old_log_probs_from_forward,
                )
                loss, metrics = loss_fn(inputs, self.config.loss)
                (loss * weight).backward()
                step_metrics["loss"] += float(loss.detach()) * weight
                for name, value in metrics.items():
                    step_metrics[name] += float(value.detach()) * weight
            grad_norm = self._clip_and_step()
            history["grad_norm"].append(grad_norm)
            for name, value in step_metrics.items():
                history[name].append(value)
        summary = {name: sum(values) / len(values) for name, values in history.items()}
        summary["lr"] = self.optimizer.param_groups[0]["lr"]  # the lr of the last optimizer step
        summary["optimizer_steps"] = float(self.optimizer_steps)
        return summary

    def _micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        return micro_batches(batch, self.config.micro_batch_size, self.config.max_tokens_per_micro_batch)

    @torch.no_grad()
    def evaluate_nll(self, batch: RolloutBatch) -> tuple[float, int]:
        """SFT perplexity eval: (sum of -log p over the loss-masked tokens, their count), no update."""
        self._require_onloaded()
        log_probs = self._log_probs(self.model, batch)
        mask = batch.loss_mask
        return float(-(log_probs * mask).sum()), int(mask.sum())

    def update_reference(self) -> None:
        """`ref-update-interval`: the reference model takes the policy's current weights."""
        if self.ref_model is None:
            raise RuntimeError("ref-update-interval needs a reference model (use-kl-loss with ref-load)")
        self.ref_model.load_state_dict(self.model.state_dict())

    # -- weights out -------------------------------------------------------------------------------------
    def named_weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the policy's HF state dict (tied weights appear once), for weight sync."""
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        return {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in self.model.state_dict().items()
            if not (tied and name == "lm_head.weight")
        }

    def iter_device_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's HF state dict as its live tensors (detached, on the device): what a rollout engine
        in this process copies in place (`runtime.weight_sync.in_place`)."""
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        for name, tensor in self.model.state_dict().items():
            if not (tied and name == "lm_head.weight"):
                yield name, tensor.detach()

    def parameter_checksum(self) -> float:
        return float(sum(p.detach().double().abs().sum() for p in self.model.parameters()))

    # -- memory --------------------------------------------------------------------------------------------
    def offload(self) -> None:
        """Move model and optimizer state to host memory (a no-op move on CPU); training refuses until onload."""
        self._move("cpu")
        self.device.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        self._move(self.device.torch_device)
        self.offloaded = False

    def _move(self, target: str | torch.device) -> None:
        self.model.to(target)
        if self.ref_model is not None:
            self.ref_model.to(target)
        if self.teacher_model is not None:
            self.teacher_model.to(target)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(target)

    def _require_onloaded(self) -> None:
        if self.offloaded:
            raise RuntimeError("train backend is offloaded; call onload() first")

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], *, blocking: bool = True
    ) -> CheckpointRecord | None:
        """Write `<save_dir>/iter_NNNNNNN/` (model, optimizer, RNG, `extra_state`) and point
        `latest_checkpointed_iteration.txt` at it.

        `blocking=False` (`async-save`): copy the state now, write it on a background thread and return
        None; `finished_saves()` hands out the records of completed writes.
        """
        snapshot = self._snapshot(iteration, extra_state)
        if blocking:
            for pending in self._pending_saves:  # keep saves in order (their records stay pending)
                pending.result()
            return self._write(save_dir, snapshot)
        if self._saver is None:
            self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending_saves.append(self._saver.submit(self._write, save_dir, snapshot))
        return None

    def finished_saves(self, *, wait: bool = False) -> list[CheckpointRecord]:
        """Records of the background saves that completed (all of them, waiting, with `wait`); a failed
        write raises here."""
        done = [f for f in self._pending_saves if wait or f.done()]
        self._pending_saves = [f for f in self._pending_saves if f not in done]
        return [f.result() for f in done]

    def _snapshot(self, iteration: int, extra_state: dict[str, Any]) -> _Snapshot:
        def cpu_copy(model: PreTrainedModel) -> dict[str, torch.Tensor]:
            # tied weights (embedding = lm_head) stay one tensor, as save_pretrained expects
            copies: dict[int, torch.Tensor] = {}
            out = {}
            for name, tensor in model.state_dict().items():
                key = tensor.data_ptr()
                if key not in copies:
                    copies[key] = tensor.detach().to("cpu", copy=True)
                out[name] = copies[key]
            return out

        keep_ref = self.ref_model is not None and self.config.ref_update_interval is not None
        return _Snapshot(
            iteration=iteration,
            model_state=cpu_copy(self.model),
            optimizer_state=copy.deepcopy(self.optimizer.state_dict())
            if self.config.save_optimizer
            else None,
            rng_state=torch.get_rng_state(),
            ref_state=cpu_copy(self.ref_model) if keep_ref else None,  # type: ignore[arg-type]
            state={
                "layout": CHECKPOINT_LAYOUT,
                "iteration": iteration,
                "optimizer_steps": self.optimizer_steps,
                "extra": copy.deepcopy(extra_state),
            },
        )

    def _write(self, save_dir: str, snap: _Snapshot) -> CheckpointRecord:
        started = time.perf_counter()
        final = iteration_dir(save_dir, snap.iteration)
        with atomic_directory(final, owner=self.config.owner) as scratch:
            self.model.save_pretrained(scratch / "model", state_dict=snap.model_state)
            if snap.optimizer_state is not None:
                torch.save(snap.optimizer_state, scratch / "optimizer.pt")
            torch.save({"torch": snap.rng_state}, scratch / "rng.pt")
            if snap.ref_state is not None:
                self.model.save_pretrained(scratch / REFERENCE_DIR, state_dict=snap.ref_state)
            (scratch / STATE_FILE).write_text(json.dumps(snap.state, indent=2) + "\n")
        write_latest_iteration(save_dir, snap.iteration)
        log.info("wrote %s in %.2fs", final, time.perf_counter() - started)
        return record(final, snap.iteration, CheckpointFormat.TORCH)

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        """Restore the latest iteration under `load_dir`; returns (iteration, extra_state), or None if there
        is no checkpoint there yet (a first attempt starts from hf-checkpoint)."""
        iteration = latest_complete_iteration(load_dir, state_file=STATE_FILE)
        if iteration is None:
            return None
        folder = iteration_dir(load_dir, iteration)
        state = json.loads((folder / STATE_FILE).read_text())
        loaded = _transformers().AutoModelForCausalLM.from_pretrained(folder / "model", dtype=torch.float32)
        self.model.load_state_dict(loaded.state_dict())
        optimizer_file = folder / "optimizer.pt"
        if optimizer_file.is_file():
            self.optimizer.load_state_dict(torch.load(optimizer_file, map_location=self.device.torch_device))
        torch.set_rng_state(torch.load(folder / "rng.pt")["torch"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        if self.ref_model is not None and (folder / REFERENCE_DIR).is_dir():
            reference = _transformers().AutoModelForCausalLM.from_pretrained(
                folder / REFERENCE_DIR, dtype=torch.float32
            )
            self.ref_model.load_state_dict(reference.state_dict())
        return iteration, dict(state.get("extra", {}))

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord:
        """Write a Hugging Face folder (weights, config, generation config, tokenizer) to `out_dir`."""
        with atomic_directory(out_dir, owner=self.config.owner) as scratch:
            self.model.save_pretrained(scratch)
            _transformers().AutoTokenizer.from_pretrained(self.hf_checkpoint).save_pretrained(scratch)
        return record(Path(out_dir), step, CheckpointFormat.HF)


def select_policy_parameters(model: torch.nn.Module, config: TrainConfig) -> tuple[str, ...]:
    """`only-train-params-name-list` / `freeze-params-name-list` -> `requires_grad` on the model's
    parameters (before the optimizer is built); warns about patterns that matched nothing, typically
    Megatron names (`embedding`, `output_layer`) on a Hugging Face model (`embed_tokens`, `lm_head`).
    Returns the trainable names."""
    if not config.only_train_params and not config.freeze_params:
        return tuple(name for name, _ in model.named_parameters())
    named = list(model.named_parameters())
    selection = select_trainable_parameters(
        [name for name, _ in named],
        only_train=list(config.only_train_params) or None,
        freeze=list(config.freeze_params) or None,
    )
    apply_parameter_selection(named, selection)
    if selection.unmatched_patterns:
        log.warning(
            "parameter name pattern(s) %s matched no parameter of this Hugging Face model (names look "
            "like %s)",
            list(selection.unmatched_patterns),
            ", ".join(name for name, _ in named[:3]),
        )
    log.info("%d of %d parameter tensors train", len(selection.trainable), len(named))
    return selection.trainable


def to_device(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return tensor.to(device) if tensor is not None else None


def fill_log_probs(
    batch: RolloutBatch,
    log_probs: Callable[[Any, RolloutBatch], torch.Tensor],
    policy: Any | None,
    reference: Any | None,
    teacher: Any | None,
) -> RolloutBatch:
    """A train backend's `compute_log_probs`: `batch`'s `old_log_probs`, `ref_log_probs` and
    `teacher_log_probs`, each `log_probs(model, batch)` masked by the loss mask, for each of the `policy`,
    `reference` and `teacher` models given (None: that field is left as it is)."""
    if policy is not None:
        batch.old_log_probs = log_probs(policy, batch) * batch.loss_mask
    if reference is not None:
        batch.ref_log_probs = log_probs(reference, batch) * batch.loss_mask
    if teacher is not None:
        batch.teacher_log_probs = log_probs(teacher, batch) * batch.loss_mask
    return batch


def policy_loss_inputs(
    batch: RolloutBatch,
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    *,
    move: Callable[[torch.Tensor, torch.device], torch.Tensor] = torch.Tensor.to,
    old_from_forward: bool = False,
) -> LossInputs:
    """The policy loss's inputs for one micro-batch: the trainer's `log_probs` and `entropy` [B, T] and the
    batch's mask and rollout-side tensors moved to their device by `move` (megatron's queues the copy).

    `old_from_forward` (`TrainConfig.old_log_probs_from_forward`, true-on-policy mode): a batch without old
    log-probs takes these `log_probs`, detached and masked as a recompute's, as pi_old: the weights have not
    moved since the rollout's log-probs stage, so they are the same values, and every loss (TIS, custom
    ones) sees them as it would the recompute's."""
    device = log_probs.device

    def put(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else move(tensor, device)

    loss_mask = move(batch.loss_mask, device)
    old = put(batch.old_log_probs)
    if old is None and old_from_forward:
        old = log_probs.detach() * loss_mask
    return LossInputs(
        log_probs=log_probs,
        entropy=entropy,
        loss_mask=loss_mask,
        old_log_probs=old,
        ref_log_probs=put(batch.ref_log_probs),
        advantages=put(batch.advantages),
        rollout_log_probs=put(batch.rollout_log_probs),
        returns=put(batch.returns),
        teacher_log_probs=put(batch.teacher_log_probs),
    )


LOG_PROB_ROWS = 256  # rows per forward-only pass without `log-probs-max-tokens-per-gpu`


def log_prob_batches(batch: RolloutBatch, max_tokens: int | None) -> list[RolloutBatch]:
    """A forward-only pass's micro-batches: by token budget (`log-probs-max-tokens-per-gpu`) when set."""
    if max_tokens:
        return batch.token_budget_batches(max_tokens)
    return batch.micro_batches(LOG_PROB_ROWS)


def micro_batches(batch: RolloutBatch, micro_batch_size: int, max_tokens: int | None) -> list[RolloutBatch]:
    """A global batch's micro-batches: by token budget (dynamic batch size) when set, else by count."""
    if max_tokens:
        return batch.token_budget_batches(max_tokens)
    return batch.micro_batches(micro_batch_size)


def micro_batch_weight(micro: RolloutBatch, step: RolloutBatch, *, per_token_loss: bool) -> float:
    """A micro-batch's share of its optimizer step's loss, so the weighted sum of the micro-batches' losses is
    the loss of the whole step in one batch.

    Per-token loss (`calculate-per-token-loss`, the `token_mean` reducer): token_count(micro) /
    token_count(step), the normaliser Relax divides by, where a sample with no trained token counts as one
    (masks [1, 1] | [0, 0], [1, 1] in two micro-batches: 2/5 and 3/5, not 2/4 and 2/4). `step` is the whole
    optimizer step, on every data-parallel rank (the megatron backend's rank holds a share of it), so the
    normaliser is the step's across ranks. Otherwise (the per-sample reducers): the micro-batch's share of
    the step's samples."""
    if per_token_loss:
        return float(token_count(micro.loss_mask)) / float(token_count(step.loss_mask))
    return micro.batch_size / step.batch_size


def clip_and_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip_grad: float | None, lr: float
) -> float:
    """Clip the accumulated gradients (`clip-grad`; 0 or None: no clipping), take one optimizer step at
    `lr`, clear the gradients; returns the gradient norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(
        torch.nn.utils.clip_grad_norm_(params, clip_grad if clip_grad and clip_grad > 0 else math.inf)
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
