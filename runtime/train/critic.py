"""PPO's critic on the torch backend: a Hugging Face model body with a scalar value head, its own AdamW.

The value of a prefix is read off the last hidden state of its last token, so column t of `values` is
V(tokens[:t]) (the state before token t is sampled), shifted exactly like the log-probs; column 0 is 0.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from runtime.algos.losses import LossInputs, LossType, resolve_loss_fn
from runtime.devices import Device
from runtime.train.checkpoint import (
    CheckpointFormat,
    CheckpointRecord,
    atomic_directory,
    iteration_dir,
    read_latest_iteration,
    record,
    write_latest_iteration,
)
from runtime.train.torch_backend import (
    OptimizerConfig,
    OptimizerStepper,
    micro_batch_weight,
    micro_batches,
    position_ids_for,
    to_device,
)
from runtime.types import RolloutBatch

# not at import (~1.2 s, and ~1.5 s more for PreTrainedModel): the driver imports this module for CriticConfig,
# a megatron critic rank for its checkpoint layout; transformers is imported where the model loads (as
# torch_backend.py says)
if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def _auto_model() -> type:
    from transformers import AutoModel

    return AutoModel


CRITIC_STATE_FILE = "critic_state.json"
VALUE_HEAD_FILE = "value_head.pt"
CRITIC_SUBDIR = "critic"  # `<save>/critic/` when `critic-save` is not set


@dataclass(frozen=True)
class CriticConfig(OptimizerConfig):
    """The spec fields the critic reads: `critic-lr` (default lr) with `critic-lr-warmup-iters`, the
    actor's batching and optimizer settings, and `value-clip` (in `loss`)."""


class ValueModel(torch.nn.Module):
    """`body` (a transformer without its LM head) + `value_head` (hidden -> 1, zero-initialised, so a fresh
    critic predicts 0 and PPO's first advantages are the plain returns)."""

    def __init__(self, body: PreTrainedModel) -> None:
        super().__init__()
        self.body = body
        self.value_head = torch.nn.Linear(int(body.config.hidden_size), 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """tokens, attention_mask [B, T] -> values [B, T] with values[:, t] = V(tokens[:, :t])."""
        hidden = self.body(
            input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask)
        ).last_hidden_state
        per_prefix = self.value_head(hidden).squeeze(-1)  # [B, T]: V(tokens[:, : t + 1])
        return torch.nn.functional.pad(per_prefix[:, :-1], (1, 0))


class TorchCriticBackend(OptimizerStepper):
    """The `critic` role's model and optimizer. Weights start from `model_path` (the policy's initial
    checkpoint) with a fresh value head, unless `load_checkpoint` restores a saved critic."""

    def __init__(self, model_path: str, config: CriticConfig, *, device: Device) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.device = device
        body = _auto_model().from_pretrained(model_path, dtype=torch.float32)
        self.model = ValueModel(body).to(device.torch_device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr_schedule.lr_at(0),
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.loss_fn = resolve_loss_fn(LossType.VALUE_LOSS)
        self.optimizer_steps = 0

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch, chunk: int = 256) -> torch.Tensor:
        """V at rollout time, [B, T], zero outside the response (the old values of value clipping)."""
        self.model.eval()
        device = self.device.torch_device
        parts = [
            self.model(part.tokens.to(device), part.attention_mask.to(device))
            for part in batch.micro_batches(chunk)
        ]
        self.model.train()
        width = batch.tokens.shape[1]
        # padded and joined where they were computed: one copy to the host, not one (and a sync) per part
        values = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]).cpu()
        steps = batch.response_mask if batch.response_mask is not None else batch.loss_mask
        return values * steps

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Fit V to `batch.returns` (clipped around `batch.values`): optimizer steps of `global_batch_size`
        samples over micro-batches, as the policy trainer does. Metrics averaged over the steps."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic trains on batch.values (rollout time) and batch.returns (GAE)")
        global_size = self.config.global_batch_size or batch.batch_size
        history: dict[str, list[float]] = defaultdict(list)
        device = self.device.torch_device
        for start in range(0, batch.batch_size, global_size):
            global_batch = batch.select(slice(start, start + global_size))
            step: dict[str, float] = defaultdict(float)
            for micro in micro_batches(
                global_batch, self.config.micro_batch_size, self.config.max_tokens_per_micro_batch
            ):
                weight = micro_batch_weight(
                    micro, global_batch, per_token_loss=self.config.loss.per_token_loss
                )
                values = self.model(micro.tokens.to(device), micro.attention_mask.to(device))
                unused = torch.zeros_like(values)
                loss, metrics = self.loss_fn(
                    LossInputs(
                        log_probs=unused,
                        entropy=unused,
                        loss_mask=micro.loss_mask.to(device),
                        values=values,
                        old_values=to_device(micro.values, device),
                        returns=to_device(micro.returns, device),
                    ),
                    self.config.loss,
                )
                (loss * weight).backward()
                for name, value in metrics.items():
                    step[name] += float(value.detach()) * weight
            step["grad_norm"] = self._clip_and_step()
            for name, value in step.items():
                history[name].append(value)
        summary = {name: sum(v) / len(v) for name, v in history.items()}
        summary["lr"] = self.optimizer.param_groups[0]["lr"]
        return summary

    # -- checkpoints: `<root>/iter_NNNNNNN/{model/, value_head.pt, optimizer.pt, critic_state.json}` ----------
    def save_checkpoint(self, root: str, iteration: int) -> CheckpointRecord:
        started = time.perf_counter()
        final = iteration_dir(root, iteration)
        with atomic_directory(final, owner=self.config.owner) as scratch:
            self.model.body.save_pretrained(scratch / "model")
            torch.save(self.model.value_head.state_dict(), scratch / VALUE_HEAD_FILE)
            torch.save(self.optimizer.state_dict(), scratch / "optimizer.pt")
            state = {"iteration": iteration, "optimizer_steps": self.optimizer_steps}
            (scratch / CRITIC_STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        write_latest_iteration(root, iteration)
        log.info("wrote critic %s in %.2fs", final, time.perf_counter() - started)
        return record(final, iteration, CheckpointFormat.TORCH)

    def load_checkpoint(self, root: str) -> int | None:
        """Restore the latest critic under `root` (a critic checkpoint root, or a job's `save` holding one
        in `critic/`); None when there is none yet (the critic starts fresh)."""
        found = critic_checkpoint_root(root)
        if found is None:
            return None
        iteration = read_latest_iteration(found)
        assert iteration is not None
        folder = iteration_dir(found, iteration)
        state = json.loads((folder / CRITIC_STATE_FILE).read_text())
        if "layout" in state:  # only the megatron critic's checkpoints name a layout
            raise ValueError(
                f"{folder} is a {state['layout']!r} checkpoint: the megatron critic's, not the torch one's"
            )
        body = _auto_model().from_pretrained(folder / "model", dtype=torch.float32)
        self.model.body.load_state_dict(body.state_dict())
        self.model.value_head.load_state_dict(torch.load(folder / VALUE_HEAD_FILE))
        optimizer_file = folder / "optimizer.pt"
        if optimizer_file.is_file():
            self.optimizer.load_state_dict(torch.load(optimizer_file, map_location=self.device.torch_device))
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        log.info("critic restored from %s", folder)
        return iteration


def critic_checkpoint_root(path: str | Path) -> Path | None:
    """`path` itself when it holds critic checkpoints, else `path/critic` when that does, else None."""
    for candidate in (Path(path), Path(path) / CRITIC_SUBDIR):
        iteration = read_latest_iteration(candidate)
        if iteration is not None and (iteration_dir(candidate, iteration) / CRITIC_STATE_FILE).is_file():
            return candidate
    return None


def critic_save_root(critic_save: str | None, save: str | None) -> str | None:
    """Where critic checkpoints go: `critic-save`, else `<save>/critic`, else nowhere. A `critic-save` equal
    to `save` also means `<save>/critic` (the policy's `iter_*` folders are there)."""
    if critic_save and (not save or Path(critic_save).resolve() != Path(save).resolve()):
        return critic_save
    return str(Path(save) / CRITIC_SUBDIR) if save else None
