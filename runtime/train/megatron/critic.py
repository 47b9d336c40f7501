"""PPO's critic on the megatron backend (docs/adr/0006, "The critic").

The policy's `GPTModel` (built and loaded as `MegatronTrainBackend` builds it) with its output layer replaced
by a value head (hidden -> 1, zero-initialised, the same weights on every tensor-parallel rank), trained on
the clipped value loss (`runtime.algos.value` through the `value_loss` loss type) with megatron's DDP,
distributed optimizer and schedules: everything but the head and the loss is `MegatronModelRunner`'s.

The contract is `runtime.train.critic.TorchCriticBackend`'s: column t of `compute_values` is V(tokens[:t]),
read off the final hidden state of token t - 1, so column 0 is 0; values are zero outside the response; a
fresh critic predicts 0, so PPO's first advantages are the plain returns. Checkpoints are torch_dist in
`<root>/iter_NNNNNNN/` (model with its value head, optimizer, RNG) with `critic_state.json`, found by
`critic_checkpoint_root` like the torch critic's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from runtime.algos.losses import LossInputs, LossType, resolve_loss_fn
from runtime.devices import Device
from runtime.train.base import TrainContext
from runtime.train.checkpoint import CheckpointRecord
from runtime.train.critic import CRITIC_STATE_FILE, CriticConfig, critic_checkpoint_root
from runtime.train.megatron import checkpoint as ckpt
from runtime.train.megatron.backend import MegatronModelRunner, _Micro, _to
from runtime.train.megatron.convert import unwrap
from runtime.train.megatron.cpu import install_cpu_shims
from runtime.train.torch_backend import micro_batches
from runtime.types import RolloutBatch

log = logging.getLogger(__name__)

CRITIC_LAYOUT = "relax-megatron-critic/1"
# A critic of one rank (its `resource` entry has one device): the policy's model-parallel sizes (spec values,
# by dest) do not apply to it.
ONE_RANK_VALUES: dict[str, Any] = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
    "num_virtual_stages_per_pipeline_rank": None,
    "num_layers_per_virtual_pipeline_stage": None,
    "sequence_parallel": False,
}


def critic_context(
    rank: int, world_size: int, master_addr: str, master_port: int, values: Mapping[str, Any]
) -> TrainContext:
    """Where one critic rank stands: on several ranks, in the job's own parallel layout (the values as they
    are, as the policy's ranks read them, so a critic of the actor's size splits the model as the actor
    does); alone, with `ONE_RANK_VALUES` over them, so a one-device critic runs whatever layout the policy
    has (what the critic role always did before it had ranks)."""
    layout = dict(values) if world_size > 1 else {**dict(values), **ONE_RANK_VALUES}
    return TrainContext(rank, world_size, master_addr, master_port, layout)


class ValueHead(torch.nn.Linear):
    """hidden -> 1 in place of the last stage's LM output layer, zero-initialised (a fresh critic predicts 0).
    Replicated across tensor-parallel ranks: its input (the final, normed hidden states) is the same on each,
    so are its gradients, and megatron counts it once in the gradient norm (like a layer norm's weight)."""

    def __init__(self, hidden_size: int, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(hidden_size, 1, bias=True, dtype=dtype, device=device)
        torch.nn.init.zeros_(self.weight)
        torch.nn.init.zeros_(self.bias)


class MegatronCriticBackend(MegatronModelRunner):
    """The `critic` role's model chunks and optimizer on this rank (SPMD like the policy's ranks)."""

    def __init__(
        self,
        model_path: str,
        config: CriticConfig,
        *,
        device: Device,
        context: TrainContext | None = None,
        hf_checkpoint: str | None = None,
    ) -> None:
        """`model_path`: the initial weights, a Hugging Face folder or a checkpoint root of the megatron
        backend (its latest iteration's policy); the value head starts at zero either way. `hf_checkpoint`:
        the folder whose `config.json` the architecture comes from (default `model_path`)."""
        self._start(hf_checkpoint or model_path, config, device, context or TrainContext())
        source = ("megatron", model_path) if ckpt.is_checkpoint_root(model_path) else ("hf", model_path)
        self.models = self._build_and_load(source)
        self._attach_value_heads(self.models)
        self.compiled_layers = self._compile_layers(self.models)
        self.ddp_models = self._wrap_ddp(self.models)
        self.optimizer = self._build_optimizer()
        self.loss_fn = resolve_loss_fn(LossType.VALUE_LOSS)
        log.info(
            "megatron critic rank %d: tp=%d pp=%d dp=%d, %d layers, hidden %d, %s, from %s",
            self.rank,
            self.layout.tp,
            self.layout.pp,
            self.dp_size,
            self.args.num_layers,
            self.args.hidden_size,
            self.model_config.params_dtype,
            model_path,
        )

    def _attach_value_heads(self, models: list) -> None:
        """The last stage's output layer becomes a `ValueHead`. No chunk shares its embedding with an output
        layer any more (megatron would otherwise all-reduce the embedding's gradient with the head's)."""
        for model in models:
            gpt = unwrap(model)
            gpt.share_embeddings_and_output_weights = False
            if gpt.post_process:
                device = next(gpt.parameters()).device
                gpt.output_layer = ValueHead(
                    self.args.hidden_size, dtype=self.model_config.params_dtype, device=device
                )

    # -- the head ----------------------------------------------------------------------------------------------
    def _values(self, micro: _Micro, gpt: Any, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, width] values of the micro-batch's real rows: column t = V(tokens[:t]), column 0 = 0."""
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        if self.layout.sequence_parallel:
            # every tensor-parallel rank computes the whole head and loss: the gather's backward only splits
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        per_prefix = gpt.output_layer(hidden).squeeze(-1)  # [s, b]: V of the prefix up to each position
        return micro.unpack(per_prefix)  # column t: the position of token t - 1 (padded rows or a pack)

    def _value_outputs(self, micro: _Micro, gpt: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        values = self._values(micro, gpt, hidden)
        # kept on the device: `_per_token` moves the whole pass's values to the host once
        return values.sum() * 0.0, {"values": values.detach()}

    def _value_loss(
        self, num_micro: int, micro: _Micro, gpt: Any, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        values = self._values(micro, gpt, hidden)
        device = values.device
        part = micro.batch
        unused = torch.zeros_like(values)
        loss, metrics = self.loss_fn(
            LossInputs(
                log_probs=unused,
                entropy=unused,
                loss_mask=_to(part.loss_mask, device),
                values=values,
                old_values=_to(part.values, device),
                returns=_to(part.returns, device),
            ),
            self.config.loss,
        )
        reported = {name: (value.detach(), micro.weight) for name, value in metrics.items()}
        return loss * self._loss_scale(micro, num_micro), reported

    # -- the critic's interface (runtime.train.critic.TorchCriticBackend's) ----------------------------------------
    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """V at rollout time, [B, T], zero outside the response (the old values of value clipping); every
        data-parallel replica computes its share, in the training micro-batches."""
        install_cpu_shims()
        self._require_onloaded()
        self._sync_params()
        share = self._dp_share(batch)
        parts = micro_batches(share, self.config.micro_batch_size, self.config.max_tokens_per_micro_batch)
        values = self._per_token(self.ddp_models, batch, parts, self._value_outputs, "values")
        steps = batch.response_mask if batch.response_mask is not None else batch.loss_mask
        return values * steps

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Fit V to `batch.returns` (clipped around `batch.values`): optimizer steps of `global_batch_size`
        samples over micro-batches, weighted as the policy's. Metrics (rank 0): value_loss, value_clipfrac,
        grad_norm averaged over the steps; lr, optimizer_steps."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic trains on batch.values (rollout time) and batch.returns (GAE)")
        return self._train(batch, self._value_loss)

    def save_checkpoint(self, root: str, iteration: int) -> CheckpointRecord | None:
        """`<root>/iter_NNNNNNN/` in torch_dist: the model with its value head, the optimizer, the RNG states
        (a collective; the record on rank 0)."""
        install_cpu_shims()
        self._sync_params()
        sharded = self._model_sharded_state(optimizer=True, rng=True, loading=False)
        state = {
            "layout": CRITIC_LAYOUT,
            "iteration": iteration,
            "optimizer_steps": self.optimizer_steps,
            "has_optimizer": True,
            "parallel": self._parallel_state(),
        }
        return self._save_sharded(
            root, iteration, sharded, state, blocking=True, state_file=CRITIC_STATE_FILE
        )

    def load_checkpoint(self, root: str) -> int | None:
        """Restore the latest critic under `root` (a critic checkpoint root, or a job's `save` holding one in
        `critic/`); None when there is none yet (the critic starts fresh)."""
        install_cpu_shims()
        found = critic_checkpoint_root(root)
        if found is None:
            return None
        located = ckpt.latest(found, state_file=CRITIC_STATE_FILE, layout=CRITIC_LAYOUT)
        assert located is not None
        iteration, folder, state = located
        if state.get("layout") != CRITIC_LAYOUT:
            raise ValueError(
                f"{folder} is not a megatron critic checkpoint ({CRITIC_LAYOUT}): the torch critic's"
            )
        with_optimizer = bool(state.get("has_optimizer", True))
        sharded = self._model_sharded_state(optimizer=with_optimizer, rng=True, loading=True)
        self._restore(ckpt.load(folder, sharded), with_optimizer=with_optimizer, with_rng=True)
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        log.info("critic restored from %s", folder)
        return iteration
